"""Z3 behind one module: decide what normal forms leave open.

Terms become Z3 Real expressions. Opaque functions are uninterpreted, with the axioms that
make common identities provable (exp > 0, sqrt(x)^2 = x where x >= 0, ...). Each term's
definedness condition (`Poly.dom`) is encoded beside its value: a pair differs where one
side is defined and the other is not, or both are defined with different values (both
undefined: both non-finite, not compared; see docs/equivalence.md). Nothing about a
denominator or a domain is assumed globally. unsat proves all pairs equal; sat gives a
model (to be replayed concretely before anyone calls it a counterexample); anything else is
unknown.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import z3

from tv_ir.semantics import terms as T
from tv_ir.semantics.scale_symbols import SCALE_KIND

SolverError = z3.Z3Exception  # z3's own exceptions, for modules that do not import z3

# A query's budget is counted in z3's resource units (`rlimit`), not in seconds, so that its
# answer does not depend on the machine's load: two runs, or one worker and N workers, give
# the same verdicts and reports. A second of `--timeout` buys RLIMIT_PER_SECOND units (z3
# 5.4 on this project's 2-core machines spends 1.1 to 3.4 million units per CPU second on
# some of tv's queries, 4.7 to 7.3 million on others: integer gathers, guarded partial ops;
# docs/benchmarks.md, "Solver budgets"). z3 does not check its budget everywhere: a
# backstop interrupts a query that has used BACKSTOP_SLACK times its budget's seconds of
# CPU time (CPU, not wall-clock time, so that load does not decide it either).
RLIMIT_PER_SECOND = 3_000_000
BACKSTOP_SLACK = 10.0
BACKSTOP_POLL_S = 0.05

# z3's timeout is not always honoured on nonlinear queries (seen with sqrt and inverses):
# cap its memory so such a query ends as `unknown` instead of exhausting the machine
MEMORY_MB = 4096
_memory_cap = [0]  # the cap in force (0: none; set per query by `_cap_memory`)


def _cap_memory() -> None:
    """Under a run's memory limit (`--memory-limit`), z3 gets at most what is left of it."""
    from ..limits import memory_left_mb

    left = memory_left_mb()
    cap = MEMORY_MB if left is None else int(max(16, min(MEMORY_MB, left)))
    if cap != _memory_cap[0]:
        z3.set_param("memory_max_size", cap)
        _memory_cap[0] = cap


def _lift_memory_cap() -> None:
    """No cap outside a query: z3 allocates while it deletes a context (`Z3_del_context`
    catches nothing), and over a cap lowered below what z3 then holds that allocation threw
    `out_of_memory_error` through C++ and aborted the process (a 32-device jit step under
    `--memory-limit`). `_cap_memory` sets the cap again before the next query."""
    if _memory_cap[0] != 0:
        z3.set_param("memory_max_size", 0)  # 0: no limit
        _memory_cap[0] = 0


MONOTONE_PAIRS = 24  # applications of one function related pairwise (quadratic in this)


@dataclass
class SmtResult:
    status: str  # "unsat" (proved), "sat", "unknown"
    model: dict[int, float] = field(default_factory=dict)  # symbol atom id -> value
    reason: str = ""


class _Encoder:
    def __init__(self):
        self.atoms: dict[int, z3.ArithRef] = {}
        self.side: list = []
        self.funcs: dict[str, z3.FuncDeclRef] = {}
        self.symbols: dict[int, z3.ArithRef] = {}
        self.applied: dict[str, list] = {}  # function name -> [(argument, result, domain)]
        self.ints: set[int] = set()  # atom ids of integer symbols
        self.bools: dict = {}
        self.names: dict = {}  # what a variable stands for -> its name in this query
        self.big = None  # the variable standing for +inf (-big: -inf), once one is met
        self.ordered: list = []  # finite values a max, min or select may weigh against it
        # linear arithmetic over integer symbols only (no functions, real symbols or
        # products of symbols): z3's QF_LIA solver decides it
        self.linear_int = True

    def _name(self, key, what: str) -> str:
        """A variable's name, numbered in the order this query meets it: never a term's
        atom id, which depends on what the process built before (a worker process and one
        worker number atoms differently; the same query must be the same text for z3)."""
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = f"{what}!{len(self.names)}"
        return name

    def fn(self, name: str, arity: int = 1):
        self.linear_int = False
        f = self.funcs.get(name)
        if f is None:
            f = z3.Function(f"tv_{name}", *([z3.RealSort()] * (arity + 1)))
            self.funcs[name] = f
        return f

    def poly(self, p: T.Poly, ordered: bool = False):
        """p as a Z3 Real. An infinity is allowed only where it is `ordered` (compared,
        chosen by a select, taken the max or min of): there it is a variable `big` (or
        -big) above every finite value weighed against it (docs/equivalence.md, "Infinities
        in SMT")."""
        if p.inf:
            if not ordered:
                raise ValueError("infinite term")
            if self.big is None:
                self.linear_int = False
                self.big = z3.Real(self._name("big", "big"))
            return self.big if p.inf > 0 else -self.big
        out = []
        for m, c in p.terms.items():
            if len(m) > 1 or (m and m[0][1] != 1):
                self.linear_int = False
            factors = []
            for aid, e in m:
                base = self.atom(T.ATOM_BY_ID[aid])
                if e < 0:  # where base = 0 the term is undefined (its dom says so)
                    factors.append(1 / (base ** (-e)) if e != -1 else 1 / base)
                else:
                    factors.append(base**e if e != 1 else base)
            coeff = z3.RealVal(str(c)) if not isinstance(c, int) else z3.RealVal(c)
            term = coeff
            for f in factors:
                term = term * f
            out.append(term)
        if not out:
            return z3.RealVal(0)
        return z3.Sum(out) if len(out) > 1 else out[0]

    def atom(self, a: T.Atom):
        hit = self.atoms.get(a.id)
        if hit is not None:
            return hit
        k, args = a.kind, a.args
        if k == "sym":
            e = self._symbol(a)
        elif k == "inv":
            self.linear_int = False
            e = 1 / self.poly(args[0])
        elif k == "fn":
            e = self._function(args[0], self.poly(args[1]))
        elif k in ("max", "min"):
            items = [self._weighed(x) for x in args[0]]
            e = items[0]
            for x in items[1:]:
                e = z3.If(x > e, x, e) if k == "max" else z3.If(x < e, x, e)
        elif k == "select":
            e = z3.If(self.boolean(args[0]), self._weighed(args[1]), self._weighed(args[2]))
        elif k in ("pow", "atan2"):
            e = self.fn(k, 2)(self.poly(args[0]), self.poly(args[1]))
        elif k == "opaque":  # one float operation's result on a non-finite operand
            self.linear_int = False
            e = z3.Real(self._name(("opaque", args[0]), "opaque"))
        elif k == "wrap":
            e = self._wrap(a)
        elif k == "apply":  # an element of an opaque function's result at its arguments
            key, result, index, xs = args
            f = self.fn(self._name(("apply", key, result, index), "apply"), len(xs))
            e = f(*(self.poly(x) for x in xs))
        else:
            raise ValueError(f"cannot encode atom kind {k}")
        self.atoms[a.id] = e
        return e

    def _weighed(self, p: T.Poly):
        """An operand of a max, min or select: it may be an infinity; a finite one is
        recorded, for `big` to lie above it."""
        e = self.poly(p, ordered=True)
        if not T._may_be_infinite(p):
            self.ordered.append(e)
        return e

    def big_facts(self) -> list:
        """`big` above every finite value a max, min or select weighs: in the programs such
        a value meets the infinity itself, which exceeds it (none when no infinity)."""
        if self.big is None:
            return []
        return [z3.And(self.big > e, self.big > -e) for e in self.ordered]

    def _symbol(self, a: T.Atom):
        """A symbol's variable, named by its atom id (printed names may repeat); an integer
        symbol (its Key's element type) is an Int within its type's range."""
        key, index = a.args
        name = self._name(("sym", a.id), f"{key}{list(index) if index else ''}")
        r = key.int_range if isinstance(key, T.Key) else None
        if r is None:
            self.linear_int = False
            e = z3.Real(name)
            if isinstance(key, T.Key) and key.kind == SCALE_KIND:  # stands for any s > 0
                self.side.append(e > 0)
        else:
            v = z3.Int(name)
            self.ints.add(a.id)
            self.side += [v >= r[0], v <= r[1]]
            e = z3.ToReal(v)
        self.symbols[a.id] = e
        return e

    def _wrap(self, a: T.Atom):
        """p reduced modulo 2**bits into the range: p == w + k * 2**bits, lo <= w <= hi."""
        p, bits, signed = a.args
        lo, hi = T.int_bounds(bits, signed)
        w = z3.Int(self._name(("wrap", a.id), "wrap"))
        k = z3.Int(self._name(("wrap_k", a.id), "wrap_k"))
        self.side += [w >= lo, w <= hi, z3.ToReal(w + k * (1 << bits)) == self.poly(p)]
        return z3.ToReal(w)

    def _function(self, name: str, x):
        exact = _EXACT.get(name)
        if exact is not None:  # piecewise functions z3 states exactly: no uninterpreted one
            self.linear_int = False
            return exact(x)
        f = self.fn(name)
        y = f(x)
        if name == "exp":
            self.side.append(y > 0)
        elif name == "sqrt":
            self.side.append(z3.Implies(x >= 0, z3.And(y >= 0, y * y == x)))
        elif name == "rsqrt":
            self.side.append(z3.Implies(x > 0, z3.And(y > 0, y * y * x == 1)))
        elif name == "tanh":
            self.side += [y > -1, y < 1]
        elif name == "logistic":
            self.side += [y > 0, y < 1]
        self._shape_facts(name, x, y)
        return y

    def _shape_facts(self, name: str, x, y) -> None:
        """Where a monotone function crosses its landmarks (log x < 0 exactly where x < 1,
        exp x > 1 where x > 0, ...) and that it is increasing between two of its
        applications: true facts that keep the solver's models close to the real functions,
        so a model of a guard like `log(2 y) == 0` puts y at 1/2 and replays."""
        landmarks = {  # name: (domain, the argument where y = value, value)
            "exp": (None, 0, 1),
            "expm1": (None, 0, 0),
            "log": (x > 0, 1, 0),
            "log1p": (x > -1, 0, 0),
            "tanh": (None, 0, 0),
            "erf": (None, 0, 0),
            "logistic": (None, 0, z3.RealVal("1/2")),
            "sqrt": (x >= 0, 0, 0),
        }
        if name not in landmarks:
            return
        dom, at, val = landmarks[name]
        facts = [
            (x == at) == (y == val),
            (x > at) == (y > val),
        ]
        self.side.append(z3.Implies(dom, z3.And(facts)) if dom is not None else z3.And(facts))
        for x2, y2, dom2 in self.applied.setdefault(name, [])[:MONOTONE_PAIRS]:
            both = [d for d in (dom, dom2) if d is not None]
            mono = z3.And((x < x2) == (y < y2), (x == x2) == (y == y2))
            self.side.append(z3.Implies(z3.And(both), mono) if both else mono)
        self.applied[name].append((x, y, dom))

    def differ(self, a: T.Poly, b: T.Poly):
        """Where a and b differ: one defined and not the other, or both with other values."""
        if a.dom is b.dom:
            if a.dom is T.TRUE:
                return self.poly(a, True) != self.poly(b, True)
            return z3.And(self.boolean(a.dom), self.poly(a, True) != self.poly(b, True))
        da, db = self.boolean(a.dom), self.boolean(b.dom)
        return z3.Or(da != db, z3.And(da, self.poly(a, True) != self.poly(b, True)))

    def boolean(self, b: T.Bool):
        k, args = b.kind, b.args
        if k == "const":
            return z3.BoolVal(bool(args[0]))
        if k == "cmp":
            p = self.poly(args[1], ordered=True)
            return p > 0 if args[0] == ">" else p >= 0 if args[0] == ">=" else p == 0
        if k == "not":
            return z3.Not(self.boolean(args[0]))
        if k == "opaque":
            return z3.Bool(self._name(("opaque_bool", args[0], args[1]), "opaque"))
        if k == "finite_at":
            self.linear_int = False
            if args[0] == "integer":
                return z3.IsInt(self.poly(args[1]))
            if args[0] == "apply":  # whether an opaque element is finite: a function of the
                # opaque function's arguments too (not of the element's value)
                key, result, index, xs = T.as_atom(args[1]).args
                name = self._name(("finite", key, result, index), "finite")
                f = self.funcs.get(name)
                if f is None:
                    sorts = [z3.RealSort()] * len(xs)
                    f = self.funcs[name] = z3.Function(f"tv_{name}", *sorts, z3.BoolSort())
                return f(*(self.poly(x) for x in xs))
            f = self.funcs.get(f"finite_at_{args[0]}")
            if f is None:
                f = z3.Function(f"tv_finite_at_{args[0]}", z3.RealSort(), z3.BoolSort())
                self.funcs[f"finite_at_{args[0]}"] = f
            return f(self.poly(args[1]))
        items = [self.boolean(x) for x in args[0]]
        if k == "and":
            return z3.And(items)
        if k == "or":
            return z3.Or(items)
        if k == "xor":
            out = items[0]
            for x in items[1:]:
                out = z3.Xor(out, x)
            return out
        raise ValueError(f"cannot encode boolean kind {k}")


def check_equal(pairs: list[tuple], timeout_s: float = 10.0) -> SmtResult:
    """Is a == b for every (a, b) pair, for all values of the symbols (where defined)?
    Each query has a z3 context of its own: its answer (a model above all) depends on the
    query, never on the queries this process asked before, so a check decided by worker
    processes gets the counterexample one worker gets."""
    with _own_context():
        return _check_equal(pairs, timeout_s)


@contextlib.contextmanager
def _own_context():
    """z3's default context replaced by a fresh one while the block runs; the memory cap a
    query ran under is lifted before the context is deleted."""
    saved = z3.z3._main_ctx
    z3.z3._main_ctx = z3.Context()
    try:
        yield
    finally:
        _lift_memory_cap()
        z3.z3._main_ctx = saved


def _check_equal(pairs: list[tuple], timeout_s: float) -> SmtResult:
    enc = _Encoder()
    try:
        diffs = []
        for a, b in pairs:
            if isinstance(a, T.Bool) or isinstance(b, T.Bool):
                diffs.append(enc.boolean(T.lift_bool(a)) != enc.boolean(T.lift_bool(b)))
            else:
                diffs.append(enc.differ(T.lift(a), T.lift(b)))
    except (ValueError, z3.Z3Exception) as e:
        return SmtResult("unknown", reason=f"not encodable in SMT: {e}")
    try:
        _cap_memory()
        # the same difference asked once (replicated results repeat it on every device;
        # z3 shares equal expressions, so their ids are equal)
        diffs = list({d.get_id(): d for d in diffs}.values())
        return _solve(enc, diffs, timeout_s)
    except z3.Z3Exception as e:  # z3's own failures (out of memory, ...): never a traceback
        return SmtResult("unknown", reason=f"z3 failed: {_z3_message(e)}")
    except MemoryError:
        return SmtResult("unknown", reason="z3 failed: out of memory")


def _solve(enc: _Encoder, diffs: list, timeout_s: float) -> SmtResult:
    from ..limits import time_left

    # an integer gather's query: QF_LIA's solver decides one of XLA's tests in 10 million
    # units where the general one needs 10 to 50 (by the order of its variables)
    s = z3.SolverFor("QF_LIA") if enc.linear_int else z3.Solver()
    s.set("rlimit", max(1, int(timeout_s * RLIMIT_PER_SECOND)))
    # a query never outlives the run's time limit, but z3's own `timeout` is not how: with
    # one set, z3 decides some queries another way, whose budget the rlimit does not
    # measure alike (an integer gather of XLA's tests: unsat in 1.8 s and 10 million units
    # without it, unknown at 30 million with it), so whether a time limit was given would
    # decide the verdict. The watchdog interrupts z3 at the time limit instead.
    left = time_left()
    s.add(*enc.side, *enc.big_facts())
    s.add(z3.Or(diffs) if len(diffs) > 1 else diffs[0])
    # z3 does not always honour its limits on nonlinear queries: interrupt it past the
    # backstop (CPU seconds, so a loaded machine does not trigger it) or the time limit
    done, fired = threading.Event(), threading.Event()
    wall_s = None if left is None else max(0.01, left)
    watchdog = threading.Thread(
        target=_backstop,
        args=(s.ctx, timeout_s * BACKSTOP_SLACK, wall_s, done, fired),
        daemon=True,
    )
    watchdog.start()
    try:
        r = s.check()
        # the checks for a moderate model are queries too: under the same watchdog, and
        # none begun once it has fired (it interrupts once: past it they ran unbounded, for
        # 18 minutes of a 150-s limit on a 24-layer scan)
        m = _moderate_model(s, enc, s.model(), fired) if r == z3.sat else None
    finally:
        done.set()
    if r == z3.unsat:
        return SmtResult("unsat")
    if r == z3.sat:
        model = {}
        for aid, e in enc.symbols.items():
            v = m.eval(e, model_completion=True)
            model[aid] = _to_int(v) if aid in enc.ints else _to_float(v)
        return SmtResult("sat", model)
    return SmtResult("unknown", reason=f"z3: {_unknown_reason(s.reason_unknown())}")


# a model whose real values reach this magnitude is asked for again within it: a float32
# replay cannot tell apart values near 2^31 (its spacing there is 128), so such a model
# (picked beside integer indices, or above an infinity's stand-in) often fails to replay
MODEL_MAGNITUDE = 2.0**20


def _moderate_model(s, enc: _Encoder, m, fired: threading.Event | None = None):
    """A model with the real symbols within MODEL_MAGNITUDE when one exists; else one with
    its large values twice as far out (`x < -1e9` for `max(x, -1e9) != x`: just below -1e9,
    float32's rounding carries x back across the threshold); else `m`. Only which
    difference is shown changes, never whether one exists."""
    reals = [e for aid, e in enc.symbols.items() if aid not in enc.ints]
    large = []
    for e in reals:
        v = m.eval(e, model_completion=True)
        if z3.is_rational_value(v) and abs(_to_float(v)) >= MODEL_MAGNITUDE:
            large.append((e, v))
    if not large:
        return m
    bound = z3.RealVal(MODEL_MAGNITUDE)
    for extra in (
        [z3.And(e > -bound, e < bound) for e in reals],
        [e <= 2 * v if _to_float(v) < 0 else e >= 2 * v for e, v in large],
    ):
        if fired is not None and fired.is_set():
            break  # the query's time is up: the first model stands
        found = _model_with(s, extra)
        if found is not None:
            return found
    return m


def _model_with(s, extra: list):
    """A model of the solver's query with `extra` added, or None."""
    s.push()
    try:
        s.add(*extra)
        return s.model() if s.check() == z3.sat else None
    except z3.Z3Exception:
        return None
    finally:
        s.pop()


def _backstop(
    ctx,
    cpu_s: float,
    wall_s: float | None,
    done: threading.Event,
    fired: threading.Event | None = None,
) -> None:
    """Interrupt z3 once this process has spent `cpu_s` CPU seconds on the query, or
    `wall_s` seconds have passed (the run's time limit), unless the query ended first;
    `fired` is set when it does."""
    cpu0, t0 = time.process_time(), time.monotonic()
    while not done.wait(BACKSTOP_POLL_S):
        spent = time.process_time() - cpu0
        if spent > cpu_s or (wall_s is not None and time.monotonic() - t0 > wall_s):
            if fired is not None:
                fired.set()
            ctx.interrupt()
            return


def _floor(x):
    return z3.ToReal(z3.ToInt(x))  # z3's to_int is the floor


def _round_half_even(x):
    up = z3.ToInt(x + z3.RealVal("1/2"))  # round half up
    tie = z3.ToReal(up) == x + z3.RealVal("1/2")
    return z3.ToReal(z3.If(z3.And(tie, up % 2 != 0), up - 1, up))


# functions of one real that z3 can state exactly (the others are uninterpreted, with axioms):
# `sign(x) * |x| = x` and `floor(x) = -ceil(-x)` are then proved, and a model of
# `round(x) != floor(x + 1/2)` is a tie such as 0.5 that replays
_EXACT = {
    "sign": lambda x: z3.If(x > 0, z3.RealVal(1), z3.If(x < 0, z3.RealVal(-1), z3.RealVal(0))),
    "floor": _floor,
    "ceil": lambda x: -_floor(-x),
    "round_nearest_afz": lambda x: z3.If(
        x >= 0, _floor(x + z3.RealVal("1/2")), -_floor(-x + z3.RealVal("1/2"))
    ),
    "round_nearest_even": _round_half_even,
}


def _unknown_reason(z3_reason: str) -> str:
    """z3 says `canceled` when a query used up its resource budget: that is the timeout."""
    return "timeout" if z3_reason == "canceled" else z3_reason


def _z3_message(e: Exception) -> str:
    v = getattr(e, "value", None)
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    return str(v if v is not None else e) or type(e).__name__


def _to_int(v) -> int:
    """An integer symbol's model value, exactly (int64 values do not survive float64)."""
    if z3.is_rational_value(v) and v.denominator_as_long() == 1:
        return v.numerator_as_long()
    return round(_to_float(v))


def _to_float(v) -> float:
    try:
        if z3.is_rational_value(v):
            return float(v.numerator_as_long()) / float(v.denominator_as_long())
        if z3.is_algebraic_value(v):
            return float(v.approx(20).as_fraction())
    except Exception:
        pass
    try:
        return float(str(v).rstrip("?"))
    except ValueError:
        return 0.0
