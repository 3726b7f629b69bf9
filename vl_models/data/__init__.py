"""Training data: tokenization and (pure, seeded) masking and sampling."""
