"""Tiny deterministic stand-ins for encoders, for evaluator tests that must not depend on a network."""
import numpy as np


class CosineByName:
    """Bi-encoder: "anchor" -> [1, 0]; "c=<x>" -> [x, sqrt(1 - x^2)], so cos(anchor, "c=x") = x."""

    def __init__(self):
        self.calls = 0

    def encode(self, sentences, batch_size=64, **kwargs):
        self.calls += 1
        out = []
        for s in sentences:
            if s == "anchor":
                out.append([1.0, 0.0])
            else:
                c = float(s.split("=", 1)[1])
                out.append([c, np.sqrt(1.0 - c * c)])
        return np.asarray(out, np.float32)


class HashEncoder:
    """Bi-encoder: a fixed random unit vector per distinct sentence (seeded by the text)."""

    def __init__(self, dim=8):
        self.dim = dim

    def encode(self, sentences, batch_size=64, **kwargs):
        import zlib

        rows = [np.random.default_rng(zlib.crc32(s.encode())).normal(size=self.dim) for s in sentences]
        return np.asarray(rows, np.float32)


class OverlapCrossEncoder:
    """Cross-encoder: score = number of shared lower-cased words (no `encode`)."""

    def predict(self, pairs):
        return np.array([len(set(a.lower().split()) & set(b.lower().split())) for a, b in pairs], np.float32)


def write_tsv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))
    return str(path)
