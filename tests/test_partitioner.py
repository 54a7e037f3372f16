"""XLA's SPMD partitioner through jaxlib: per-device program and layouts out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.xla.partitioner import partition


def test_megatron_mlp_is_partitioned_with_its_layouts() -> None:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def s(*spec):
        return NamedSharding(mesh, P(*spec))

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2

    f = jax.jit(
        mlp,
        in_shardings=(s("data", None), s(None, "model"), s("model", None)),
        out_shardings=s("data", None),
    )
    args = [np.ones(sh, np.float32) for sh in [(8, 16), (16, 32), (32, 16)]]
    p = partition(f.lower(*args).as_text())
    assert p.num_partitions == 8
    assert p.arg_shardings[1] == "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert p.out_shardings == ["{devices=[2,1,4]<=[8] last_tile_dim_replicate}"]
    per_device = tv_ir.load(p.per_device_hlo)
    assert [t.shape for t in per_device.main.arg_types] == [(4, 16), (16, 8), (8, 16)]
    assert any(op.name == "stablehlo.all_reduce" for op in per_device.main.body.ops)


def test_entry_shardings_read_from_the_module_before_partitioning(tmp_path) -> None:
    # when XLA:CPU cannot compile the partitioned program (ragged_all_to_all), the layouts
    # are read from the partitioner's input; they are the executable's, tuple results too
    from tv_ir.xla.partitioner import entry_shardings

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))

    def s(*spec):
        return NamedSharding(mesh, P(*spec))

    f = jax.jit(
        lambda x, y: ((x @ y).sum(0), x * 2, y.T),
        in_shardings=(s("a", "b"), s("b", None)),
        out_shardings=(s("a"), s(None, "b"), s()),
    )
    args = [np.ones((8, 4), np.float32), np.ones((4, 8), np.float32)]
    p = partition(f.lower(*args).as_text(), pass_dumps=str(tmp_path))
    (before,) = tmp_path.glob("*before_spmd-partitioning*.txt")
    assert entry_shardings(before.read_text()) == (p.arg_shardings, p.out_shardings)
    assert len(p.out_shardings) == 3


def test_cheap_codegen_leaves_the_partitioned_program_and_its_shardings(monkeypatch) -> None:
    # tv reads XLA's module right after partitioning and the executable's shardings; the
    # CPU code generated afterwards is made the cheap way (partitioner.CHEAP_CODEGEN), which
    # must change neither (checked on the whole XLA SPMD corpus when it was introduced)
    from tv_ir.xla import partitioner

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "model"))

    def s(*spec):
        return NamedSharding(mesh, P(*spec))

    def step(x, w1, w2):
        h = jax.nn.gelu(x @ w1)
        loss = jnp.mean((h @ w2) ** 2)
        return loss, jnp.tanh(h).sum(axis=0)

    f = jax.jit(
        step,
        in_shardings=(s(("data", "fsdp"), None), s("fsdp", "model"), s("model", "fsdp")),
        out_shardings=(s(), s("model")),
    )
    args = [np.ones(sh, np.float32) for sh in [(8, 16), (16, 32), (32, 16)]]
    text = f.lower(*args).as_text()
    cheap = partition(text)
    monkeypatch.setattr(partitioner, "CHEAP_CODEGEN", {})
    full = partition(text)
    assert partitioner.CHEAP_CODEGEN == {} and cheap.per_device_hlo == full.per_device_hlo
    assert (cheap.arg_shardings, cheap.out_shardings) == (full.arg_shardings, full.out_shardings)
    assert "all-reduce" in cheap.per_device_hlo
