"""The syllables every invented name is made of (the synthetic world's cities and listings, the QA
encyclopedia's people, towns and organisations), so held-out names look like the ones in training."""

NAME_SYLLABLES = (
    "ba", "bel", "bri", "ca", "cor", "da", "del", "dro", "fa", "fen", "ga", "gor", "ha", "hel", "ka", "kel", "la",
    "len", "lo", "ma", "mer", "mo", "na", "nor", "no", "pa", "pel", "ra", "ren", "ro", "sa", "sel", "so", "ta",
    "tor", "tu", "va", "ven", "vi", "wa", "wel", "za", "zor", "qui", "thal", "bran", "ster", "mira", "lune", "ash",
)
