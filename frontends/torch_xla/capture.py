"""Run a PyTorch model (or training step) on torch_xla's SPMD device with the user's
shardings and capture the lazy graph as one StableHLO module.

The module's arguments come in torch_xla's order; `Captured.args` says what each one is: a
named parameter, an example argument, an optimizer-state tensor, or a value the program
merely reads (buffers, Python scalars torch_xla turned into device data, the collectives'
token), which the rewrite inlines as a constant.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tv_ir.errors import BadInput

from . import runtime
from .step import TrainStep


@dataclass
class Arg:
    """One argument of the captured module."""

    name: str  # "l1.weight", "args[0]", "state[l1.weight].exp_avg", "const3"
    kind: str  # "param" | "input" | "state" | "const"
    value: np.ndarray | None = None  # for "const": the value to inline


@dataclass
class Captured:
    bytecode: bytes  # StableHLO portable artifact (torch_xla's text form does not re-parse)
    args: list[Arg]
    outputs: list[str]  # name of each result
    name: str  # what was captured, e.g. "Block.forward"
    num_devices: int
    param_names: list[str] = field(default_factory=list)


def capture(
    target: Any,
    args: tuple,
    *,
    mesh: Any = None,
    shardings: dict | None = None,
    input_shardings: Any = None,
) -> Captured:
    """Trace `target` (an `nn.Module`, a `TrainStep` or a function of tensors) at `args`;
    mark the given shardings (none: an unsharded program) and capture the graph."""
    rt = runtime.require()
    torch, xm = rt.torch, rt.xm
    dev = rt.torch_xla.device()
    shardings = dict(shardings or {})
    step = target if isinstance(target, TrainStep) else None
    model = step.model if step else target if isinstance(target, torch.nn.Module) else None
    if model is None and not callable(target):
        raise BadInput(f"{target!r} is neither an nn.Module, a TrainStep nor a function")
    if (shardings or input_shardings) and mesh is None:
        raise BadInput("shardings given without mesh=: pass a torch_xla.distributed.spmd.Mesh")
    if mesh is not None and not isinstance(mesh, rt.xs.Mesh):
        raise BadInput(f"mesh must be a torch_xla.distributed.spmd.Mesh, not {type(mesh).__name__}")
    tid = rt.torch_xla._XLAC._xla_get_tensor_id
    roles: dict[int, tuple[str, str]] = {}

    params: dict[str, Any] = {}
    if model is not None:
        model = copy.deepcopy(model).to(dev)
        params = dict(model.named_parameters())
        unknown = sorted(set(shardings) - set(params))
        if unknown:
            raise BadInput(
                f"shardings name no parameter of {type(model).__name__}: {', '.join(unknown)} "
                f"(parameters: {', '.join(params) or 'none'})"
            )
        for name, spec in shardings.items():
            _mark(rt, params[name], mesh, spec, f"shardings[{name!r}]")
    elif shardings:
        raise BadInput("shardings name parameters, but the target is a plain function")

    xargs = [a.detach().clone().to(dev) if isinstance(a, torch.Tensor) else a for a in args]
    specs = _input_specs(input_shardings, len(args))
    for i, (a, spec) in enumerate(zip(xargs, specs, strict=True)):
        if spec is not None:
            if not isinstance(a, torch.Tensor):
                raise BadInput(f"input_shardings[{i}] given for a non-tensor argument")
            _mark(rt, a, mesh, spec, f"input_shardings[{i}]")

    opt = None
    if step is not None:
        opt = step.optimizer(list(model.parameters()))
        for _ in range(step.warmup):
            _train(torch, step, model, opt, xargs)
            rt.torch_xla.sync()
    for name, p in params.items():
        roles[tid(p)] = (name, "param")
    for i, a in enumerate(xargs):
        if isinstance(a, torch.Tensor):
            roles.setdefault(tid(a), (f"args[{i}]", "input"))
    if opt is not None:
        for name, key, t in _state_tensors(torch, opt, params):
            roles[tid(t)] = (f"state[{name}].{key}", "state")

    try:
        if step is not None:
            loss = _train(torch, step, model, opt, xargs)
            outputs = [("loss", loss)] + [(f"{n} (updated)", p) for n, p in params.items()]
            outputs += [
                (f"state[{n}].{k} (updated)", t) for n, k, t in _state_tensors(torch, opt, params)
            ]
            what = f"{type(model).__name__} training step ({type(opt).__name__})"
        else:
            out = model(*xargs) if model is not None else target(*xargs)
            outputs = _flatten(torch, out, "output")
            what = f"{type(model).__name__}.forward" if model is not None else _fn_name(target)
    except BadInput:
        raise
    except Exception as e:
        raise BadInput(f"{_fn_name(target)} failed on torch_xla: {_one_line(e)}") from e
    if not outputs:
        raise BadInput(f"{what} returns no tensors")

    tensors = [t for _, t in outputs]
    ids, values = rt.torch_xla._XLAC._get_tensors_xla_device_data_node(tensors)
    bytecode = xm.get_stablehlo_bytecode(tensors)
    cargs = []
    for i, (t_id, value) in enumerate(zip(ids, values, strict=True)):
        name, kind = roles.get(t_id, (f"const{i}", "const"))
        val = value.detach().cpu().numpy() if kind == "const" else None
        cargs.append(Arg(name, kind, val))
    return Captured(
        bytecode=bytecode,
        args=cargs,
        outputs=[n for n, _ in outputs],
        name=what,
        num_devices=int(mesh.size()) if mesh is not None else 1,
        param_names=list(params),
    )


def _train(torch, step: TrainStep, model, opt, xargs):
    opt.zero_grad()
    loss = step.loss_fn(model, *xargs)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise BadInput("TrainStep loss_fn must return a scalar tensor")
    loss.backward()
    opt.step()
    return loss


def _state_tensors(torch, opt, params: dict):
    """(parameter name, state key, tensor) for the optimizer's device-resident state."""
    by_param = {id(p): n for n, p in params.items()}
    for p, st in opt.state.items():
        for key, t in sorted(st.items()):
            if isinstance(t, torch.Tensor) and t.device.type == "xla":
                yield by_param.get(id(p), "?"), key, t


def _mark(rt, t, mesh, spec, what: str) -> None:
    spec = tuple(spec) if isinstance(spec, (tuple, list)) else spec
    if not isinstance(spec, tuple):
        raise BadInput(f"{what}: a partition spec is a tuple of axis names or None, not {spec!r}")
    if len(spec) != t.dim():
        raise BadInput(
            f"{what}: partition spec {spec} has {len(spec)} entries for a {t.dim()}-d tensor"
        )
    names = set(mesh.axis_names or ())
    for s in spec:
        for ax in s if isinstance(s, tuple) else (s,):
            if ax is not None and ax not in names:
                raise BadInput(f"{what}: mesh has no axis {ax!r} (axes: {sorted(names)})")
    try:
        rt.xs.mark_sharding(t, mesh, spec)
    except Exception as e:
        raise BadInput(f"{what}: mark_sharding failed: {_one_line(e)}") from None


def _input_specs(input_shardings: Any, n: int) -> list:
    if input_shardings is None:
        return [None] * n
    specs = list(input_shardings)
    if len(specs) != n:
        raise BadInput(f"input_shardings has {len(specs)} entries for {n} example arguments")
    return specs


def _flatten(torch, out: Any, path: str) -> list:
    if isinstance(out, torch.Tensor):
        return [(path, out)]
    if isinstance(out, (tuple, list)):
        return [x for i, o in enumerate(out) for x in _flatten(torch, o, f"{path}[{i}]")]
    if isinstance(out, dict):
        return [x for k, o in out.items() for x in _flatten(torch, o, f"{path}[{k!r}]")]
    if out is None:
        return []
    raise BadInput(f"{path} is a {type(out).__name__}, not a tensor (or tuple/list/dict of them)")


def _fn_name(fn: Any) -> str:
    if hasattr(fn, "forward") and hasattr(fn, "named_parameters"):
        return f"{type(fn).__name__}.forward"
    return getattr(fn, "__qualname__", None) or repr(fn)


def _one_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
