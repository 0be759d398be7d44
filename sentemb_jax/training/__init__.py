"""Training: optimisers, the contrastive train step (with GradCache) and the train loop."""
