"""sentemb_jax: sentence encoders in JAX/Flax, from a laptop CPU to a TPU pod."""
from sentemb_jax.checkpoints import CheckpointError
from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.encoder import SentenceEncoder

__all__ = ["SentenceEncoder", "CrossEncoder", "CheckpointError"]
__version__ = "0.1.0"
