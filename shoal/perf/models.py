"""Architecture descriptions of the models the planner reasons about.

``GPTConfig`` is the Megatron-LM GPT layout (Narayanan et al. 2021, Korthikanti et al. 2022):
``L`` transformer layers of hidden size ``h`` with ``a`` heads, a 4h MLP, learned position
embeddings for sequence length ``s`` and a vocabulary of ``V`` tokens whose embedding is tied to
the output layer. Its parameter count is ``12Lh^2 (1 + 13/(12h) + (V+s)/(12Lh))``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.spec.errors import SpecError


@dataclass(frozen=True, slots=True)
class GPTConfig:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecError(f"must be a positive integer, got {value!r}", field=name)
        if self.hidden % self.heads:
            raise SpecError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}); "
                "pick a head count that divides the hidden size",
                field="heads",
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_parameters(self) -> int:
        """QKV (3h^2+3h), projection (h^2+h), MLP (8h^2+5h) and two layer norms (4h)."""
        h = self.hidden
        return 12 * h * h + 13 * h

    @property
    def embedding_parameters(self) -> int:
        """Word embeddings (tied to the output layer) and learned position embeddings."""
        return (self.vocab + self.seq) * self.hidden

    @property
    def final_norm_parameters(self) -> int:
        return 2 * self.hidden

    def num_parameters(self) -> int:
        """Megatron's count ``12Lh^2 + 13Lh + (V+s)h`` (it leaves out the final layer norm)."""
        return self.layers * self.layer_parameters + self.embedding_parameters

    def exact_parameters(self) -> int:
        """Every parameter of the module, including the final layer norm's ``2h``."""
        return self.num_parameters() + self.final_norm_parameters

    def forward_flops(self, micro_batch: int) -> float:
        """FLOPs of one forward pass (Narayanan et al. 2021, section 5.1).

        ``24Bslh^2 (1 + s/(6h))`` for the transformer layers plus ``2BshV`` for the logits.
        """
        b, s, h = micro_batch, self.seq, self.hidden
        layers = 24.0 * b * s * self.layers * h * h * (1.0 + s / (6.0 * h))
        return layers + 2.0 * b * s * h * self.vocab

    def attention_core_flops(self, micro_batch: int) -> float:
        """FLOPs of QK^T and attention-times-V in all layers: what selective recompute redoes."""
        return 4.0 * micro_batch * self.seq * self.seq * self.hidden * self.layers

    def training_flops(self, micro_batch: int, recomputed_layer_fraction: float = 0.0,
                       selective: bool = False) -> float:
        """FLOPs of forward + backward (3x forward) plus recomputation.

        Full recomputation of every layer gives ``96Bslh^2 (1 + s/(6h) + V/(16lh))``.
        """
        fwd = self.forward_flops(micro_batch)
        logits = 2.0 * micro_batch * self.seq * self.hidden * self.vocab
        extra = recomputed_layer_fraction * (fwd - logits)
        if selective:
            extra += (1.0 - recomputed_layer_fraction) * self.attention_core_flops(micro_batch)
        return 3.0 * fwd + extra


def parse_gpt_spec(text: str) -> GPTConfig:
    """``gpt:layers=32,hidden=4096,heads=32,seq=2048,vocab=51200`` -> GPTConfig."""
    kind, _, rest = text.partition(":")
    if kind.strip().lower() != "gpt" or not rest:
        raise SpecError(
            f"expected 'gpt:layers=..,hidden=..,heads=..,seq=..,vocab=..', got {text!r}",
            field="model",
        )
    fields: dict[str, int] = {}
    for item in rest.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in GPTConfig.__dataclass_fields__:
            raise SpecError(
                f"unknown or malformed entry {item!r}; use layers=, hidden=, heads=, seq=, vocab=",
                field="model",
            )
        try:
            fields[key] = int(value)
        except ValueError:
            raise SpecError(
                f"{key} must be an integer, got {value!r}", field=f"model.{key}"
            ) from None
    missing = [k for k in GPTConfig.__dataclass_fields__ if k not in fields]
    if missing:
        raise SpecError(f"missing {', '.join(missing)}", field="model")
    return GPTConfig(**fields)


# Weak-scaling GPT configurations of Narayanan et al. 2021 (Table 1), V=51200, s=2048:
# published size in billions, (heads, hidden, layers), tensor and pipeline degree, GPUs, batch.
MEGATRON_GPT_TABLE: tuple[tuple[float, int, int, int, int, int, int, int], ...] = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512),
    (3.6, 32, 3072, 30, 2, 1, 64, 512),
    (7.5, 32, 4096, 36, 4, 1, 128, 512),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072),
)


def megatron_gpt(billions: float) -> GPTConfig:
    """One of the published Megatron configurations by its size, e.g. ``megatron_gpt(1008.0)``."""
    for size, heads, hidden, layers, *_ in MEGATRON_GPT_TABLE:
        if size == billions:
            return GPTConfig(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200)
    known = ", ".join(str(row[0]) for row in MEGATRON_GPT_TABLE)
    raise SpecError(f"no published configuration of {billions}B; known: {known}", field="model")
