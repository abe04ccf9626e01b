"""The transformers policy backend: token-in/token-out generation for the loop on CPU (and small GPU runs).

Every request of a turn is decoded in ONE batch (or a few, if `max_batch_size` splits them): batching the active
episodes is what makes CPU rollouts affordable.

With `chunk_tokens`, a turn is decoded in rounds of at most that many tokens, and each round batches only the
episodes still writing: `generate` keeps computing every row of its batch until the LAST one ends, so one turn that
runs on to the token limit made all others pay for its hundreds of tokens (benchmarks/bench_rollout_chunks.py).

Across turns an episode's context only grows (previous context + sampled turn + tool segment), so the backend keeps
each episode's key/value cache (keyed by `TurnRequest.episode_id`) and, next turn, runs the model only on the new
tokens instead of re-reading the whole history: prefill is most of the work at our context lengths. A cache is used
only for the longest prefix of the request's ids it was computed on, and all caches are dropped when the model's
weights change (an RL update), so results never depend on stale states.

One rule picks how those cached turns are decoded, with no option to change it. Where `lean_decode.supports` the
model (Llama and Qwen2 models with full attention and the default rotary embedding, on a CPU: the tiny and smoke
presets), the lean decoder (`components/agent/lean_decode.py`) runs the same function as the model's forward one step
at a time over per-episode buffers that grow in place, with rows leaving the batch as their turns end. It spares
`generate`'s per-round rebuild of a padded batch cache and `torch.multinomial` (benchmarks/bench_smollm2.py,
bench_rollout_chunks.py). Everything else (a GPU, other architectures) decodes with transformers' `generate` over a
left-padded batch of the episodes' caches. Both compute the same distribution: greedy turns are the same tokens,
sampled ones draw from different random streams.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache

from components.agent import lean_decode
from components.agent.lean_decode import common_prefix_length
from components.agent.types import TurnPolicy, TurnRequest, TurnResult
from components.models.loading import end_of_turn_ids


def filtered_probs(scaled_logits, top_k: int, top_p: float):
    """softmax(scaled_logits) restricted as transformers' top-k and top-p warpers restrict it (top_k 0 and top_p 1:
    unrestricted): the k most likely tokens, then the smallest set of the most likely whose mass reaches top_p
    (always at least one token); renormalised by the draw, not here."""
    probs = torch.softmax(scaled_logits, dim=-1)
    if top_k and top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        before = ordered.cumsum(dim=-1) - ordered  # mass of the tokens more likely than each one
        ordered = ordered.masked_fill(before >= top_p * ordered.sum(dim=-1, keepdim=True), 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
    return probs


def require_token_ids(requests: list[TurnRequest]) -> None:
    """Refuse text-only requests: this backend reads and returns token ids."""
    if any(request.token_ids is None for request in requests):
        raise ValueError("HFPolicy is a token backend: run the loop with a tokenizer so requests carry token_ids")


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Left-pad token id lists to one length; returns (input ids, attention mask) as nested lists."""
    width = max(len(s) for s in sequences)
    ids = [[pad_id] * (width - len(s)) + list(s) for s in sequences]
    mask = [[0] * (width - len(s)) + [1] * len(s) for s in sequences]
    return ids, mask


def cut_at_end_of_turn(ids: list[int], end_ids: int | tuple[int, ...], max_new_tokens: int
                       ) -> tuple[list[int], bool]:
    """The sampled ids up to and including the first end-of-turn token (`end_ids`: `<|im_end|>` and the model's own
    end-of-sequence tokens), at most `max_new_tokens` of them; and whether the turn finished (the policy sampled one
    of them within its budget)."""
    ends = {end_ids} if isinstance(end_ids, int) else set(end_ids)
    ids = ids[:max_new_tokens]
    for position, token in enumerate(ids):
        if token in ends:
            return ids[: position + 1], True
    return ids, False


def cache_kwarg(forward) -> str:
    """The keyword that passes a key/value cache to a model's `forward` (and its `generate`): transformers 5.24
    renamed `past_key_values` to `cache` (the old name warns, and goes in 5.40); older releases know only the old."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def returned_cache(output):
    """The cache a forward or generate call returned, under either release's attribute name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


@dataclass
class PartialTurn:
    """A turn decoded over several rounds: the context ids it continues and what was sampled so far."""

    context: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class EpisodeCache:
    """One episode's key/value states: `layers[l] = (keys, values)` of shape [1, kv_heads, len(ids), head_dim],
    computed on exactly `ids` (no padding)."""

    ids: list[int]
    layers: list


class HFPolicy(TurnPolicy):
    """A `Policy` backed by a transformers causal LM.

    Reads each request's `token_ids` (the whole context, ending with the generation prompt) and returns the sampled
    `token_ids` (ending with `<|im_end|>` when the model stopped), their `logprobs` under the sampling distribution
    (logits / temperature, before top-p filtering; under greedy decoding, the plain model distribution), and the text
    without the end-of-turn token. Sampling is seeded: the same seed and requests give the same turns.
    With `reuse_cache` (default) and distinct `episode_id`s, each episode's key/value cache is kept between calls
    (see the module docstring); set it False to re-read every context (e.g. to save memory on large models).
    With `chunk_tokens` (needs the episode caches) a turn is sampled in rounds of at most that many tokens, each over
    the episodes whose turn has not ended yet (None: one `generate` call per batch, every row until the last ends).
    Cached turns are decoded by the lean decoder where `lean_decode.supports` the model (`lean` is then True:
    components/agent/lean_decode.py, an inverse-CDF draw per token), else by transformers' `generate`; turns without
    episode caches always by `generate`. Both compute the same distribution; greedy turns are the same tokens,
    sampled ones draw from different random streams.
    """

    def __init__(self, model, tokenizer, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 greedy: bool = False, seed: int = 0, max_batch_size: int | None = None, reuse_cache: bool = True,
                 chunk_tokens: int | None = None):
        if chunk_tokens is not None and chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be a positive number of tokens or None, got {chunk_tokens}")
        if not greedy and temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling; use greedy=True for argmax decoding")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.greedy = greedy
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.end_ids = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        self.end_id = self.end_ids[0]
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id
        self.calls = 0  # advances the seed, so successive turns draw fresh samples reproducibly
        self.reuse_cache = reuse_cache
        self.chunk_tokens = chunk_tokens
        self.lean = lean_decode.supports(model)  # cached turns: the lean decoder (True) or `generate`
        self.caches: dict[str, EpisodeCache] = {}
        self.rows: dict = {}  # episode id -> lean_decode.RowCache (the lean decoder's caches)
        self.partial: dict[str, PartialTurn] = {}  # turns in progress across `generate_round` calls
        self._weights_version: int | None = None

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream at `seed` (the RL engine reseeds each step from (seed, step))."""
        self.seed, self.calls = seed, 0

    def twin(self, greedy: bool = True) -> HFPolicy:
        """A policy over the same model (and weights) with greedy decoding: evaluation during training. Its
        key/value caches are its own."""
        return HFPolicy(self.model, self.tokenizer, greedy=greedy, seed=self.seed, max_batch_size=self.max_batch_size,
                        reuse_cache=self.reuse_cache, chunk_tokens=self.chunk_tokens)

    @property
    def cached_episodes(self) -> set[str]:
        """The episode ids whose key/value cache this policy holds (either decoder's)."""
        return set(self.caches) | set(self.rows)

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        """Sample the next assistant turn for every request; batches of at most `max_batch_size`."""
        require_token_ids(requests)
        caching = self._caching(requests)
        size = self.max_batch_size or len(requests) or 1
        results: list[TurnResult] = []
        decode = self._generate_in_rounds if caching and self.chunk_tokens else self._generate_batch
        for start in range(0, len(requests), size):
            results.extend(decode(requests[start:start + size], caching))
        return results

    def generate_round(self, requests: list[TurnRequest]) -> list[TurnResult | None]:
        """One round of decoding for every request: at most `chunk_tokens` more tokens of each request's turn, in one
        batched call. Returns the finished turns (the end-of-turn token or the turn's budget reached) and None for
        the turns still being written; call again with the same request to continue one (its partial turn is kept
        by `episode_id`). The agent loop uses this to let an episode whose turn ended take its environment step and
        start its next turn while the others are still writing (`loop.run_episodes`).

        Without `chunk_tokens` or episode caches a round is the whole turn (`generate`)."""
        require_token_ids(requests)
        caching = self._caching(requests)
        if not (caching and self.chunk_tokens):
            self.partial.clear()
            return self.generate(requests)
        asking = {r.episode_id for r in requests}
        self.partial = {key: turn for key, turn in self.partial.items() if key in asking}
        return self._round(requests, caching)

    def _round(self, requests: list[TurnRequest], caching: bool) -> list[TurnResult | None]:
        """`generate_round`'s decoding (caches already checked by the caller)."""
        turns = [self._partial_turn(request) for request in requests]
        size = self.max_batch_size or len(requests) or 1
        out: list[TurnResult | None] = []
        for start in range(0, len(requests), size):
            batch = list(zip(requests[start:start + size], turns[start:start + size]))
            round_requests = [replace(r, token_ids=list(r.token_ids) + turn.ids,
                                      max_new_tokens=min(self.chunk_tokens, r.max_new_tokens - len(turn.ids)))
                              for r, turn in batch]
            for (request, turn), result in zip(batch, self._generate_batch(round_requests, caching)):
                turn.ids.extend(result.token_ids)
                turn.logprobs.extend(result.logprobs)
                if result.finished or len(turn.ids) >= request.max_new_tokens:
                    self.partial.pop(request.episode_id, None)
                    out.append(self._result(turn.ids, turn.logprobs, request.max_new_tokens))
                else:
                    out.append(None)
        return out

    def _partial_turn(self, request: TurnRequest) -> "PartialTurn":
        """The turn in progress for `request`: the one kept from earlier rounds when it continues the same context,
        else a fresh one."""
        turn = self.partial.get(request.episode_id)
        if turn is None or turn.context != request.token_ids:
            turn = self.partial[request.episode_id] = PartialTurn(context=list(request.token_ids))
        return turn

    def _generate_in_rounds(self, requests: list[TurnRequest], caching: bool) -> list[TurnResult]:
        """The turns of `requests` sampled `chunk_tokens` at a time: each round is one batched call over the episodes
        whose turn is still open, continuing from what they sampled so far (their caches cover it)."""
        results: list[TurnResult | None] = [None] * len(requests)
        open_rows = list(range(len(requests)))
        while open_rows:
            for i, result in zip(open_rows, self._round([requests[i] for i in open_rows], caching)):
                results[i] = result
            open_rows = [i for i in open_rows if results[i] is None]
        return results

    def _caching(self, requests: list[TurnRequest]) -> bool:
        """Whether this call reuses episode caches (needs distinct episode ids); drops caches that cannot serve it:
        all of them after a weight update, and those of episodes no longer asking (finished)."""
        ids = [r.episode_id for r in requests]
        if not self.reuse_cache or not all(ids) or len(set(ids)) != len(ids):
            self.caches.clear()
            self.rows.clear()
            return False
        version = sum(p._version for p in self.model.parameters())
        if version != self._weights_version:
            self.caches.clear()
            self.rows.clear()
            self._weights_version = version
        asking = set(ids)
        self.caches = {key: value for key, value in self.caches.items() if key in asking}
        self.rows = {key: value for key, value in self.rows.items() if key in asking}
        return True

    def _generate_batch(self, requests: list[TurnRequest], caching: bool) -> list[TurnResult]:
        if caching and self.lean:
            return self._lean_batch(requests)

        device = next(self.model.parameters()).device
        ids, mask = left_pad([r.token_ids for r in requests], self.pad_id)
        input_ids = torch.tensor(ids, device=device)
        attention_mask = torch.tensor(mask, device=device)
        budget = max(1, max(r.max_new_tokens for r in requests))
        sampling = {"do_sample": False} if self.greedy else {
            "do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
        }
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            past = self._batched_cache(requests, input_ids.shape[1] - 1) if caching else None
            torch.manual_seed(self.seed + self.calls)
            self.calls += 1
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                **{cache_kwarg(self.model.forward): past},
                max_new_tokens=budget,
                eos_token_id=list(self.end_ids),
                pad_token_id=self.pad_id,
                output_logits=True,
                return_dict_in_generate=True,
                **sampling,
            )
        if was_training:
            self.model.train()
        new_ids = out.sequences[:, input_ids.shape[1]:]
        if caching:
            self._keep_caches(requests, out.sequences, returned_cache(out), input_ids.shape[1])
        logprobs = self._sampled_logprobs(torch.stack(out.logits, dim=1), new_ids)
        return [self._result(new_ids[i].tolist(), logprobs[i].tolist(), r.max_new_tokens)
                for i, r in enumerate(requests)]

    # ------------------------------------------------------------------------------------ the lean decoder

    def _lean_batch(self, requests: list[TurnRequest]) -> list[TurnResult]:
        """Decode every request's turn with `lean_decode`: advance each episode's buffers to its context but the last
        token, then one batched step a token over the rows still writing; a row leaves when it samples the
        end-of-turn token or reaches its `max_new_tokens`."""
        caches = [self.rows.setdefault(r.episode_id, lean_decode.RowCache.empty(self.model)) for r in requests]
        was_training = self.model.training
        self.model.eval()
        generator = torch.Generator().manual_seed(self.seed + self.calls)
        self.calls += 1
        sampled: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        with torch.no_grad():
            lean_decode.prefill(self.model, caches, [list(r.token_ids[:-1]) for r in requests])
            open_rows = [i for i, r in enumerate(requests) if r.max_new_tokens > 0]
            feed = [requests[i].token_ids[-1] for i in open_rows]
            while open_rows:
                logits = lean_decode.decode_step(self.model, [caches[i] for i in open_rows], feed)
                tokens, chosen = self._draw(logits, generator)
                still, feed = [], []
                for i, token, logprob in zip(open_rows, tokens.tolist(), chosen.tolist()):
                    sampled[i].append(token)
                    logprobs[i].append(logprob)
                    if token not in self.end_ids and len(sampled[i]) < requests[i].max_new_tokens:
                        still.append(i)
                        feed.append(token)
                open_rows = still
        if was_training:
            self.model.train()
        return [self._result(ids, lps, r.max_new_tokens) for ids, lps, r in zip(sampled, logprobs, requests)]

    def _draw(self, logits, generator):
        """The next token of every row and its log-probability under the sampling distribution (logits / temperature,
        before top-k/top-p; greedy: the plain distribution): argmax, or an inverse-CDF draw from the filtered
        distribution (what `generate` samples from, without `torch.multinomial`'s cost)."""
        logits = logits.float()
        if self.greedy:
            tokens = logits.argmax(dim=-1)
            return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
        scaled = logits / self.temperature
        log_probs = torch.log_softmax(scaled, dim=-1)
        probs = filtered_probs(scaled, self.top_k, self.top_p)
        cdf = probs.cumsum(dim=-1)
        u = torch.rand(cdf.shape[0], 1, generator=generator) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(cdf.shape[1] - 1)
        return tokens, log_probs.gather(-1, tokens[:, None])[:, 0]

    # ------------------------------------------------------------------------------------ episode caches

    def _extend(self, episode_id: str, prefix: list[int]) -> EpisodeCache:
        """The episode's cache advanced to cover exactly `prefix`: reuse the longest common prefix of the old
        cache, run the model on the rest (one unpadded sequence)."""
        old = self.caches.get(episode_id)
        keep = common_prefix_length(old.ids, prefix) if old else 0
        layers = [(k[:, :, :keep], v[:, :, :keep]) for k, v in old.layers] if old and keep else []
        rest = prefix[keep:]
        if rest:
            cache = DynamicCache()
            for index, (k, v) in enumerate(layers):
                cache.update(k, v, index)
            device = next(self.model.parameters()).device
            out = self.model(input_ids=torch.tensor([rest], device=device), use_cache=True, logits_to_keep=1,
                             **{cache_kwarg(self.model.forward): cache})
            layers = [(layer.keys, layer.values) for layer in returned_cache(out).layers]
        return EpisodeCache(ids=list(prefix), layers=layers)

    def _batched_cache(self, requests: list[TurnRequest], width: int):
        """A left-padded batch cache covering every request's ids but its last token (which `generate` feeds),
        aligned with the left-padded input ids of width `width + 1`.

        A growing cache (transformers' DynamicCache, `generate`'s own default), because it needs no size and is correct
        for every model and device this path serves, where a StaticCache must be sized per call and makes `generate`
        compile the model for every batch shape on a GPU. (Its per-token copies slow a CPU only for the models the
        lean decoder does not serve.)"""
        entries = [self._extend(r.episode_id, list(r.token_ids[:-1])) for r in requests]
        if not all(entry.layers for entry in entries):
            return None  # a one-token context: nothing to reuse, generate prefills
        cache = DynamicCache()
        for index in range(len(entries[0].layers)):
            keys, values = [], []
            for entry in entries:
                k, v = entry.layers[index]
                pad = width - k.shape[2]
                keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            cache.update(torch.cat(keys), torch.cat(values), index)
        return cache

    def _keep_caches(self, requests: list[TurnRequest], sequences, past, width: int) -> None:
        """Store each episode's slice of the batch cache after generation (every token fed to the model: its
        context and all but the last generated token), without the left padding."""
        if past is None:
            return
        length = int(past.get_seq_length())
        for row, request in enumerate(requests):
            pad = width - len(request.token_ids)
            ids = sequences[row, pad:length].tolist()
            layers = [(layer.keys[row:row + 1, :, pad:length].clone(), layer.values[row:row + 1, :, pad:length].clone())
                      for layer in past.layers]
            self.caches[request.episode_id] = EpisodeCache(ids=ids, layers=layers)

    def _sampled_logprobs(self, logits, sampled):
        """log p(sampled token) under the sampling distribution: log_softmax(logits / temperature)."""
        scale = 1.0 if self.greedy else self.temperature
        log_probs = torch.log_softmax(logits.float() / scale, dim=-1)
        return log_probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)

    def _result(self, new_ids: list[int], logprobs: list[float], max_new_tokens: int) -> TurnResult:
        ids, finished = cut_at_end_of_turn(new_ids, self.end_ids, max_new_tokens)
        text_ids = ids[:-1] if finished else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        return TurnResult(text=text, token_ids=ids, logprobs=logprobs[: len(ids)], finished=finished)
