"""shoal.train: the library a training script imports to run elastically under shoal.

    import shoal.train as st
    st.init()
    loader = st.ElasticDataLoader(dataset, batch_size=64, max_batch_size=512)
    trainer = st.ElasticTrainer(model, optimizer)
    for epoch in st.epochs(10):
        for x, y in loader:
            trainer.backward(loss_fn(trainer.model(x), y))
            trainer.step()

A job that declares its model trains under the parallel plan shoal chose for its allocation
(recomputation, FSDP / ZeRO sharding, micro-batching) with ``PlannedTrainer``:

    trainer = st.PlannedTrainer(model, torch.optim.AdamW, global_batch=64, lr=3e-4)
    loss = trainer.step(trainer.local_share(global_batch))

or applies a plan by hand with ``apply_plan(model, get_plan(default=...))``; see
docs/parallelism.md ("Applying a plan").

See docs/training.md for the environment contract and the resize protocol.
"""

from shoal.train.apply import AppliedPlan, TrainingPlan, apply_plan, get_plan
from shoal.train.context import EXIT_CHECKPOINTED, Context, current, init, log, shutdown
from shoal.train.data import ElasticDataLoader
from shoal.train.env import TrainEnv, TrainEnvError
from shoal.train.epochs import epochs
from shoal.train.planned import PlannedTrainer
from shoal.train.trainer import ElasticTrainer

__all__ = [
    "EXIT_CHECKPOINTED",
    "AppliedPlan",
    "Context",
    "ElasticDataLoader",
    "ElasticTrainer",
    "PlannedTrainer",
    "TrainEnv",
    "TrainEnvError",
    "TrainingPlan",
    "apply_plan",
    "current",
    "epochs",
    "get_plan",
    "init",
    "log",
    "shutdown",
]
