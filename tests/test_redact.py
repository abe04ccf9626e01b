"""`redact_url`: passwords and tokens in URLs never reach a message, a log line or MLflow."""
import pytest

from components.errors import UserError
from components.redact import redact_url


@pytest.mark.parametrize("text, expected", [
    ("http://bob:s3cret@llm.example.com/v1", "http://***@llm.example.com/v1"),
    ("https://ghp_token123@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
    ("postgresql://mlflow:pw@db:5432/mlflow", "postgresql://***@db:5432/mlflow"),
    ("http://host/v1?token=abc&model=qwen", "http://host/v1?token=***&model=qwen"),
    ("http://host/retrieve?api_key=1&apikey=2&key=3&access_token=4&password=5&secret=6",
     "http://host/retrieve?api_key=***&apikey=***&key=***&access_token=***&password=***&secret=***"),
    ("https://bucket.s3.amazonaws.com/f?X-Amz-Signature=ab12&X-Amz-Date=2024&sig=cd34",
     "https://bucket.s3.amazonaws.com/f?X-Amz-Signature=***&X-Amz-Date=2024&sig=***"),
    ("https://app/callback#access_token=xyz&state=1", "https://app/callback#access_token=***&state=1"),
])
def test_userinfo_and_token_like_query_values_are_masked(text, expected):
    assert redact_url(text) == expected


def test_every_url_in_a_message_is_masked_and_the_prose_around_them_kept():
    message = ("teacher http://bob:pw1@a:8000/v1 failed (retriever at http://b/retrieve?token=tok2), "
               "tracking at 'https://c/?signature=sig3'.")
    assert redact_url(message) == ("teacher http://***@a:8000/v1 failed (retriever at http://b/retrieve?token=***), "
                                   "tracking at 'https://c/?signature=***'.")


@pytest.mark.parametrize("text", [
    "http://127.0.0.1:8000/v1/chat/completions",
    "sqlite:////home/me/project/mlflow.db",
    "https://medium.com/@someone/post?keyword=tokens&max_tokens=512",
    "no url here: user:password@host is not a URL without a scheme",
])
def test_text_without_url_secrets_is_unchanged(text):
    assert redact_url(text) == text


def test_masking_twice_changes_nothing_more():
    once = redact_url("http://bob:pw@h/v1?token=t")
    assert redact_url(once) == once == "http://***@h/v1?token=***"


def test_a_user_error_never_shows_the_url_secrets_it_quotes():
    error = UserError("endpoint http://bob:s3cret@h/v1?api_key=k3y did not answer")
    assert str(error) == "endpoint http://***@h/v1?api_key=*** did not answer"
