"""Training methods beyond the contrastive dual encoder: one module per method."""
