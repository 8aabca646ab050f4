"""Model architectures by name, and the one parser for a job's ``model`` field.

A job names its architecture either in full,
``gpt:layers=32,hidden=4096,heads=32,seq=2048,vocab=51200`` (parsed by
:func:`shoal.perf.models.parse_gpt_spec`, as ``shoal plan --model`` does), or by a name from
:data:`NAMED_MODELS`, optionally with overrides: ``llama-7b`` or ``llama-7b:seq=4096``.

Every entry is laid out as :class:`~shoal.perf.models.GPTConfig` (a 4h MLP, learned position
embeddings, the word embedding tied to the output layer), at the published depth, width, head
count, vocabulary and context of the model it is named after. For GPT-3 / OPT sizes that is the
real layout. LLaMA's SwiGLU MLP (three ``h x 8h/3`` matrices) has the parameters and FLOPs of a
4h MLP; its untied output layer adds ``Vh`` parameters the tied layout counts once (2% at 7B,
0.4% at 65B) and rotary positions replace ``sh`` learned ones; LLaMA-2-70B's grouped-query
attention and wider MLP are not modelled (its GPT layout here has 65B parameters).
``num_parameters()`` of each entry gives the count the planner uses.
"""

from __future__ import annotations

from dataclasses import replace

from shoal.perf.models import GPTConfig, parse_gpt_spec
from shoal.spec.errors import SpecError
from shoal.spec.suggest import did_you_mean

NAMED_MODELS: dict[str, GPTConfig] = {
    # GPT-3 sizes (Brown et al. 2020, Table 2.1); OPT uses the same shapes.
    "gpt-1.3b": GPTConfig(layers=24, hidden=2048, heads=16, seq=2048, vocab=51200),
    "gpt-2.7b": GPTConfig(layers=32, hidden=2560, heads=32, seq=2048, vocab=51200),
    "gpt-6.7b": GPTConfig(layers=32, hidden=4096, heads=32, seq=2048, vocab=51200),
    "gpt-13b": GPTConfig(layers=40, hidden=5120, heads=40, seq=2048, vocab=51200),
    # LLaMA (Touvron et al. 2023, Table 2) and LLaMA 2 (4096-token context).
    "llama-7b": GPTConfig(layers=32, hidden=4096, heads=32, seq=2048, vocab=32000),
    "llama-13b": GPTConfig(layers=40, hidden=5120, heads=40, seq=2048, vocab=32000),
    "llama-33b": GPTConfig(layers=60, hidden=6656, heads=52, seq=2048, vocab=32000),
    "llama-65b": GPTConfig(layers=80, hidden=8192, heads=64, seq=2048, vocab=32000),
    "llama-2-7b": GPTConfig(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000),
    "llama-2-13b": GPTConfig(layers=40, hidden=5120, heads=40, seq=4096, vocab=32000),
    "llama-2-70b": GPTConfig(layers=80, hidden=8192, heads=64, seq=4096, vocab=32000),
}


def model_names() -> list[str]:
    return list(NAMED_MODELS)


def parse_model(text: str) -> GPTConfig:
    """``gpt:layers=..,hidden=..,heads=..,seq=..,vocab=..``, ``llama-7b`` or ``llama-7b:seq=4096``.

    Raises :class:`SpecError` naming the ``model`` field (or ``model.<key>``) and the fix.
    """
    try:
        return _parse_model(text)
    except SpecError as exc:
        field = exc.field or "model"
        if field.split(".")[0] == "model":
            raise
        # GPTConfig names its own field (``heads``); point at it inside ``model``.
        message = str(exc).split("': ", 1)[-1]
        raise SpecError(message, field=f"model.{field}") from None


def _parse_model(text: str) -> GPTConfig:
    if not isinstance(text, str) or not text.strip():
        raise SpecError("must be a non-empty string such as 'llama-7b' or "
                        "'gpt:layers=32,hidden=4096,heads=32,seq=2048,vocab=51200'",
                        field="model")
    name, _, rest = text.strip().partition(":")
    name = name.strip().lower()
    if name == "gpt":
        return parse_gpt_spec(text.strip())
    base = NAMED_MODELS.get(name)
    if base is None:
        raise SpecError(
            f"unknown model {name!r}{did_you_mean(name, NAMED_MODELS)}; write "
            "'gpt:layers=..,hidden=..,heads=..,seq=..,vocab=..' "
            f"or use one of: {', '.join(NAMED_MODELS)}",
            field="model",
        )
    if not rest.strip():
        return base
    changes: dict[str, int] = {}
    for item in rest.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in GPTConfig.__dataclass_fields__:
            raise SpecError(
                f"unknown or malformed override {item!r} of {name}; "
                "use layers=, hidden=, heads=, seq= or vocab=",
                field="model",
            )
        try:
            changes[key] = int(value)
        except ValueError:
            raise SpecError(f"{key} must be an integer, got {value!r}",
                            field=f"model.{key}") from None
    return replace(base, **changes)
