"""Defaults of the measured applications whose profiles ship in the Pollux artifact.

``epochs`` is the training length the artifact's simulator uses for each model; ``fixed_batch``
and ``max_replicas`` describe the NCF recommendation job, which trains at a fixed batch size on
one device in the Pollux evaluation. A profile directory may hold other applications: they get
the generic defaults (epochs from the shortest validation trace, no fixed batch).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AppDefaults:
    epochs: int | None = None
    max_local_bsz: int | None = None
    fixed_batch: int | None = None
    max_replicas: int | None = None


KNOWN_APPLICATIONS: dict[str, AppDefaults] = {
    "bert": AppDefaults(epochs=2),
    "cifar10": AppDefaults(epochs=100),
    "ncf": AppDefaults(epochs=10, fixed_batch=32768, max_replicas=1),
    "imagenet": AppDefaults(epochs=90),
    "deepspeech2": AppDefaults(epochs=80),
    "yolov3": AppDefaults(epochs=50, max_local_bsz=8),
}
