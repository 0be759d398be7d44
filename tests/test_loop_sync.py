"""The train loop does not wait for the device between steps: the host reads device values only at
the points that need them (logging, checkpoints, the last step), and a non-finite step found there
still stops the job naming its batch, with nothing of it saved."""
import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from sentemb_jax.errors import TrainingError
from sentemb_jax.training import loop


@flax.struct.dataclass
class TinyState:
    step: jax.Array
    params: dict


class Batches:
    """Source batches 1, 2, ... (batch i holds the value i; `bad` is NaN) with a position."""

    name = "tiny batches"

    def __init__(self, bad: int | None = None):
        self.position, self.bad = 0, bad

    def __iter__(self):
        while True:
            self.position += 1
            value = np.nan if self.position == self.bad else float(self.position)
            yield {"x": np.full((4, 8), value, np.float32), "x_attention_mask": np.ones((4, 8), np.int32),
                   "index": self.position}

    def state_dict(self):
        return {"position": self.position}

    def describe(self, batch):
        return f"rows of batch {batch['index']}"


@jax.jit
def step_fn(state, batch, rng):
    w = state.params["w"] - 1e-3 * jnp.tanh(batch["x"] @ state.params["w"]).mean()
    loss = jnp.mean(batch["x"] @ w)
    return state.replace(step=state.step + 1, params={"w": w}), \
        {"loss": loss, "grad_norm": jnp.abs(loss), "finite": jnp.isfinite(loss)}


def run(tmp_path, batches, num_steps=12, log_every=4, checkpoint_every=12):
    state = TinyState(step=jnp.zeros((), jnp.int32), params={"w": jnp.eye(8)})
    manager = ocp.CheckpointManager(str(tmp_path / "checkpoints"))
    schedule = loop.Schedule(num_steps=num_steps, log_every=log_every, checkpoint_every=checkpoint_every)
    return loop.RunState(state, str(tmp_path), batches, schedule, manager), manager


def device_batch(batch):
    return {"x": jax.device_put(batch["x"])}


@pytest.fixture
def host_reads(monkeypatch):
    """Where the host reads a device array's value: every read (bool / int / float / np.asarray /
    jax.device_get all go through the array's `_value`) is recorded with the RunState method it
    happened in, or None outside the ones allowed to read."""
    reads, where = [], [None]
    array_type = type(jnp.zeros(()))
    value = array_type._value

    def counted(self):
        reads.append(where[0])
        return value.fget(self)

    monkeypatch.setattr(array_type, "_value", property(counted))
    for name in ("check_finite", "log", "save"):
        original = getattr(loop.RunState, name)

        def wrapped(self, *args, _original=original, _name=name, **kwargs):
            where[0] = (_name, self.step)
            try:
                return _original(self, *args, **kwargs)
            finally:
                where[0] = None

        monkeypatch.setattr(loop.RunState, name, wrapped)
    return reads


def test_the_host_reads_the_device_only_at_log_and_checkpoint_points(tmp_path, host_reads):
    """12 steps, log every 4: the steps' finite flags are read at steps 4, 8 and 12 only, all the
    flags since the last read in one device_get; nothing else in the loop reads a device value."""
    state, manager = run(tmp_path, Batches())
    host_reads.clear()  # RunState reads the restored step once, before the loop
    loop.run_loop(state, step_fn, device_batch, jax.random.PRNGKey(0))
    assert None not in host_reads, f"{host_reads.count(None)} reads outside check_finite / log / save"
    assert sorted({w[1] for w in host_reads if w[0] == "check_finite"}) == [4, 8, 12]
    assert sum(w == ("check_finite", 4) for w in host_reads) == 4  # the four flags of steps 1-4
    assert sorted({w[1] for w in host_reads if w[0] == "log"}) == [4, 8, 12]
    assert state.step == 12 and int(state.state.step) == 12 and manager.latest_step() == 12
    assert state.tokens == 12 * 32 and state.metrics["step"] == 12


def test_the_count_sees_a_per_step_read(tmp_path, monkeypatch, host_reads):
    """The check above can fail: a loop that reads each step's finite flag (as one that waits for
    every step does) is caught, one read per step outside the allowed points."""
    accept = loop.RunState.accept

    def waiting(self, state, out, batch, started):
        bool(out["finite"])
        return accept(self, state, out, batch, started)

    monkeypatch.setattr(loop.RunState, "accept", waiting)
    state, _ = run(tmp_path, Batches())
    host_reads.clear()
    loop.run_loop(state, step_fn, device_batch, jax.random.PRNGKey(0))
    assert host_reads.count(None) == 12


def test_a_nonfinite_step_found_late_stops_naming_its_batch_and_saves_nothing(tmp_path):
    """Batch 6 is NaN, log and checkpoint every 4: step 4 is saved, the check at step 8 finds step 6,
    and the job stops naming step 6 and batch 6's rows; no checkpoint after step 4 exists."""
    state, manager = run(tmp_path, Batches(bad=6), checkpoint_every=4)
    with pytest.raises(TrainingError, match=r"at step 6; batch from rows of batch 6\. .*last checkpoint: step 4"):
        loop.run_loop(state, step_fn, device_batch, jax.random.PRNGKey(0))
    assert manager.all_steps() == [4]
    restored = manager.restore(4, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    assert np.isfinite(np.asarray(restored["params"]["w"])).all()


def test_loop_overhead_benchmark_prints_three_kinds(capsys):
    from sentemb_jax.benchmarks import loop_overhead

    loop_overhead.main(["--steps", "4", "--rounds", "1", "--width", "16", "--log_every", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("device: ") and "4 steps x 1 rounds" in out[0]
    assert [line.split(" ms/step")[0].rsplit(" ", 1)[0].strip() for line in out[1:]] == \
        ["bare step", "loop, reads at log points", "loop, reads every step"]


def test_batches_prepared_ahead_keep_their_order_and_checkpoints_the_position_trained_on(tmp_path):
    """The step's batches are made on the prefetch thread, ahead of the step: the step sees batches
    1..12 in order, the thread prepared more than that, and each checkpoint records the position
    after the batch its step took (4, 8, 12), not the source's position then."""
    import threading

    prepared, threads = [], set()

    def recording(batch):
        prepared.append(batch["index"])
        threads.add(threading.current_thread().name)
        return device_batch(batch)

    source = Batches()
    state, manager = run(tmp_path, source, checkpoint_every=4)
    loop.run_loop(state, step_fn, recording, jax.random.PRNGKey(0))
    manager.wait_until_finished()
    assert prepared[:12] == list(range(1, 13)) and threads == {"input-prefetch"}
    for step in (4, 8, 12):
        data = manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
        assert data["input"] == {"position": step}
    assert not any(t.name == "input-prefetch" for t in threading.enumerate())  # stopped with the loop


def test_an_input_error_reaches_the_loop_at_its_batch_and_the_thread_stops(tmp_path):
    """A source that fails at batch 6 (a data file's bad line): the loop raises that error after
    five steps, in its own thread, and no prefetch thread is left."""
    import threading

    from sentemb_jax.errors import DataError

    class Failing(Batches):
        def __iter__(self):
            for batch in super().__iter__():
                if batch["index"] == 6:
                    raise DataError("data.tsv:6: a bad row")
                yield batch

    state, _ = run(tmp_path, Failing())
    with pytest.raises(DataError, match="data.tsv:6: a bad row"):
        loop.run_loop(state, step_fn, device_batch, jax.random.PRNGKey(0))
    assert state.step == 5
    assert not any(t.name == "input-prefetch" for t in threading.enumerate())
