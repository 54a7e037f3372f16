"""The shape rule of `stablehlo.convolution`: which of its dimensions scale, and how.

- Batch and features are a dot's (batch, contracted, output features).
- Feature groups (`feature_group_count` G): the input features are G groups of Cg, the
  kernel's output features G groups of Kg, group-major (the op's definition splits them
  in order). Both are merged dimensions (G x Cg, G x Kg) whose group part is one class
  of its own: the groups shrink by one factor, Cg and Kg by theirs, and the reduced op
  reads its group count as reduced input features / reduced Cg. Batch groups
  (`batch_group_count` B) are the same with the input batch (B x output batch) and the
  output features (B x Kb).
- A spatial dimension scales where the op is the same sliding window at any size:
  * the window slides along the input (the kernel's spatial size is kept, and with it
    the window, strides, dilations and padding): when the input is `stride` times the
    output and the padding is "same" (`lo + hi - span` in [-stride, -1], span = the
    dilated window), a reduced input of n/f positions gives exactly o/f outputs, and
    every output position reads the same taps at the same offsets from its own start;
  * the window covers the input (a weight gradient: input size = kernel size x its
    dilation, stride 1, no input dilation or reversal): the input and the kernel scale
    together, and the output (the shifts, lo + hi + dilation of them) keeps its size;
  * a tile widened by halos (XLA's partitioned spatial dimension: `stride x output + c`
    inputs for a valid window, `dilation x kernel + c` for a weight gradient, c a small
    constant): input and output (or kernel) are one class that no factor shrinks, and an
    affine unit may (affine.py: sizes `a U + b`, the constant kept);
  * one input position against a window padded by its size less one on both sides (an
    outer product as a convolution: output o meets tap k-1-o only): the window and the
    output scale together, the padding with them;
  * anything else (lhs dilation, other paddings) keeps the spatial dimensions.
  A sliding window keeps every output whose window reads padding and two interior ones,
  and at least two windows of input (no window reads both edges' padding).
Why a verdict carries over: docs/equivalence.md, "Shape reduction".
"""

from __future__ import annotations

import itertools

from tv_ir.ir.program import Op

from .classes import DimClasses, Key

HALO = 16  # the widest halo (positions past stride x output) tied by an affine unit

# synthetic members (a convolution's group count) get negative value ids: never a Value's
_synthetic_ids = itertools.count(-1, -1)


def synthetic(d: DimClasses, size: int, name: str) -> Key:
    """A member that is no value's dimension (the number of groups of a convolution)."""
    return d.add((next(_synthetic_ids), 0), size, name)


def convolution_shapes(rules, op: Op) -> None:
    """Ties and keeps of one convolution (`rules` is the program's `ShapeRules`)."""
    d: DimClasses = rules.d
    lhs, rhs, r = op.operands[0], op.operands[1], op.results[0]
    dn = op.attrs.get("dimension_numbers")
    if dn is None:
        return rules.keep_all(op, "stablehlo.convolution without dimension numbers")
    kl, kq, kr = rules.keys(lhs), rules.keys(rhs), rules.keys(r)
    features = op.attrs.get("feature_group_count", 1) or 1
    batches = op.attrs.get("batch_group_count", 1) or 1
    if features > 1 and batches > 1:
        return rules.keep_all(op, f"convolution at {op.loc} with feature and batch groups")
    ki, ko = kq[dn.kernel_input_feature], kq[dn.kernel_output_feature]
    lb, lf, rb, rf = (
        kl[dn.input_batch],
        kl[dn.input_feature],
        kr[dn.output_batch],
        kr[dn.output_feature],
    )
    d.tie(ko, rf)
    d.at_least(ki, 2)  # contracted
    if features == 1 and batches == 1:
        d.tie(lb, rb)
        d.tie(lf, ki)
    elif features > 1:
        d.tie(lb, rb)
        groups = synthetic(d, features, f"feature groups of convolution at {op.loc}")
        _grouped(d, lf, (groups, ki), lhs.type.shape[dn.input_feature], features, op)
        _split_groups(d, ko, groups, rhs.type.shape[dn.kernel_output_feature], features, op)
    else:
        d.tie(lf, ki)
        groups = synthetic(d, batches, f"batch groups of convolution at {op.loc}")
        _grouped(d, lb, (groups, rb), lhs.type.shape[dn.input_batch], batches, op)
        _split_groups(d, ko, groups, rhs.type.shape[dn.kernel_output_feature], batches, op)
    windows = _spatial(d, op, dn, kl, kq, kr)
    if lhs.id in rules.pos.independent and rhs.id in rules.pos.independent:
        for k in (ki, *windows):  # a count computed as a sum: its size
            d.keep(k, f"convolution at {op.loc} sums values that read no input")
    # a sum over the features and over every scaled window (a count of both normalises it)
    rules.pos.summed[r.id] = (ki, *windows)
    for v in (lhs, rhs):
        rules.untrack(v, f"convolution at {op.loc}")


def _grouped(d: DimClasses, whole: Key, parts: tuple[Key, Key], size: int, groups: int, op) -> None:
    """`whole` (size `size`) is `groups` groups of parts[1], group-major."""
    if size % groups or d.real[parts[1]] * groups != size:
        return _keep(d, (whole, *parts), f"convolution groups at {op.loc} (sizes do not divide)")
    d.product(whole, parts)
    for p in parts:
        d.at_least(p, 2)  # which part is major stays observable


def _split_groups(d: DimClasses, whole: Key, groups: Key, size: int, count: int, op) -> None:
    """The kernel's output features (`size`) are `count` groups of size / count."""
    if size % count:
        return _keep(d, (whole, groups), f"convolution groups at {op.loc} (sizes do not divide)")
    per_group = synthetic(d, size // count, f"output features per group of convolution at {op.loc}")
    _grouped(d, whole, (groups, per_group), size, count, op)


def _keep(d: DimClasses, keys, why: str) -> None:
    for k in keys:
        d.keep(k, why)


def _spatial(d: DimClasses, op: Op, dn, kl, kq, kr) -> list[Key]:
    """Ties or keeps each spatial dimension; returns the kernel dimensions that scale (a
    window as long as its input: the op sums over them)."""
    lhs, rhs, r = op.operands[0], op.operands[1], op.results[0]
    summed = []
    nsp = len(dn.input_spatial)
    strides = op.attrs.get("window_strides") or (1,) * nsp
    padding = op.attrs.get("padding")
    pads = [(0, 0)] * nsp if padding is None else [tuple(p) for p in _pairs(padding, nsp)]
    lhs_dil = op.attrs.get("lhs_dilation") or (1,) * nsp
    rhs_dil = op.attrs.get("rhs_dilation") or (1,) * nsp
    reversal = op.attrs.get("window_reversal") or (False,) * nsp
    for i in range(nsp):
        a, w, o = dn.input_spatial[i], dn.kernel_spatial[i], dn.output_spatial[i]
        n, k, m = lhs.type.shape[a], rhs.type.shape[w], r.type.shape[o]
        s, (lo, hi), ld, rd = int(strides[i]), pads[i], int(lhs_dil[i]), int(rhs_dil[i])
        span = (k - 1) * rd + 1
        where = f"convolution window at {op.loc}"
        if ld == 1 and n == s * m and -s <= lo + hi - span < 0:
            # the window slides: n/f inputs give m/f outputs, the kernel keeps its taps
            d.tie(kl[a], kr[o])
            d.keep(kq[w], where)
            # every edge output (reading padding) and two interior ones; no window
            # reaching both edges
            d.at_least(kr[o], -(-lo // s) + -(-hi // s) + 2)
            d.at_least(kl[a], 2 * span)
        elif ld == 1 and s == 1 and n == rd * k and not reversal[i] and k > 1:
            # the (dilated) window covers the input: the input and kernel scale, the
            # lo + hi + dilation shifts stay
            d.tie(kl[a], kq[w])
            d.at_least(kq[w], 2 * m)
            summed.append(kq[w])
            d.keep(kr[o], f"{where} (the shifts of a window as long as its input)")
        elif ld == 1 and s == 1 and 0 < n - rd * k <= HALO and not reversal[i] and m < k:
            # the same over a tile widened by halos (n = dilation x kernel + halo; fewer
            # shifts than taps, else it is a valid window, below): the input and the kernel
            # are one class whose sizes differ by a constant, which only an affine unit
            # keeps (affine.py); the shifts stay
            d.tie(kl[a], kq[w])
            d.split_unevenly(
                kl[a],
                f"{where} (input {n}, window {k}, dilation {rd}: a weight gradient's input "
                f"widened by {n - rd * k} halo positions; no affine unit fits)",
            )
            d.at_least(kq[w], 2 * m)
            summed.append(kq[w])
            d.keep(kr[o], f"{where} (the shifts of a window as long as its input)")
        elif ld == 1 and 0 < n - s * m <= HALO and not reversal[i]:
            # a valid window over a tile widened by halos (XLA's partitioned spatial
            # dimension: n = stride x output + a constant): input and output are one class
            # whose sizes differ by that constant, which only an affine unit keeps; the
            # kernel keeps its taps, as a sliding window's
            d.tie(kl[a], kr[o])
            detail = _why_kept(n, k, m, s, lo, hi, ld, rd)
            d.split_unevenly(kl[a], f"{where} ({detail}; no affine unit fits)")
            d.keep(kq[w], where)
            d.at_least(kr[o], -(-lo // s) + -(-hi // s) + 2)
            d.at_least(kl[a], 2 * span)
        elif n == 1 and ld == 1 and s == 1 and rd == 1 and k > 1 and lo == hi == k - 1:
            # one input position padded by the window on both sides (an outer product
            # written as a convolution): output o meets tap k-1-o alone (tap o reversed),
            # so the window and the output are one class, the padding follows the window
            # (rewrite.py) and the input keeps its one position
            d.tie(kq[w], kr[o])
            d.at_least(kq[w], 2)
        else:
            detail = _why_kept(n, k, m, s, lo, hi, ld, rd)
            for key in (kl[a], kq[w], kr[o]):
                d.keep(key, f"{where} ({detail})")
    return summed


def _why_kept(n: int, k: int, m: int, s: int, lo: int, hi: int, ld: int, rd: int) -> str:
    if ld != 1:
        return f"input dilation {ld}"
    sizes = f"input {n}, window {k}, stride {s}, padding {lo}_{hi}, dilation {rd}, output {m}"
    if n > s * m:
        # XLA's partitioned spatial dimension: the tile plus halo rows from its neighbours,
        # windowed without padding; its size is the tile's plus a constant, not a multiple
        extra = n - s * m
        return f"{sizes}: a valid window or a tile widened by halos ({extra} past stride x output)"
    return f"{sizes}: not a same-padded sliding window nor a window over the whole input"


def _pairs(padding, nsp: int) -> list:
    import numpy as np

    return np.asarray(padding).reshape(nsp, 2).tolist()
