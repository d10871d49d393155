"""The catalogue (``pshybrid.registry``): the consistency grammar parsed once, the allowed
combinations, the placement predicates, and the strategies' declared interfaces. Oracles:
the grammar's definition (docs/consistency.md) and the refusal rules ``TrainConfig``
enforced before they moved here (the same verdicts, the same messages)."""

from __future__ import annotations

import itertools

import pytest

from pshybrid.registry import (COLOCATED, DEDICATED, MODES, NO_PLACEMENT, PLACEMENTS,
                               consistency_error, is_colocated, is_dedicated, is_synchronous,
                               parse_consistency, placement_name, refusal)


@pytest.mark.parametrize("text, bound", [("bsp", 0), ("ssp:0", 0), ("ssp:3", 3),
                                         ("ssp:12", 12), ("asp", None)])
def test_the_consistency_grammar(text, bound):
    c = parse_consistency(text)
    assert (c.text, c.bound, c.synchronous) == (text, bound, text == "bsp")
    assert consistency_error(text) is None and is_synchronous(text) == (text == "bsp")


@pytest.mark.parametrize("text", ["", "BSP", "ssp", "ssp:", "ssp:-1", "ssp:1.5", "asp:2", "x"])
def test_bad_consistencies_are_refused(text):
    with pytest.raises(ValueError, match="bsp, ssp:K"):
        parse_consistency(text)
    assert consistency_error(text) == "must be bsp, ssp:K (K >= 0 steps) or asp"


def test_placements():
    assert list(PLACEMENTS) == [DEDICATED, COLOCATED]
    assert is_colocated(COLOCATED) and not is_colocated(DEDICATED)
    assert is_dedicated(DEDICATED) and not is_dedicated(COLOCATED)
    assert not is_colocated(NO_PLACEMENT) and not is_dedicated(NO_PLACEMENT)
    assert [placement_name(c) for c in (False, True)] == [DEDICATED, COLOCATED]


def test_each_mode_says_what_it_needs():
    facts = {m.name: (m.needs_servers, m.sparse_on_servers, m.dense_on_servers,
                      m.dense_allreduce, m.replicated, m.hot_rows, m.stale_reads, m.chosen)
             for m in MODES.values()}
    assert facts == {
        "hybrid": (True, True, False, True, False, True, True, False),
        "ps": (True, True, True, False, False, False, True, False),
        "allreduce": (False, False, False, True, True, False, False, False),
        "auto": (False, False, False, False, False, False, False, True)}


def _old_refusal(mode, placement, servers, replicate_rows, consistency, cache_rows, device):
    """The rules as ``TrainConfig.validate`` wrote them with names, before the catalogue."""
    if mode == "auto" and (replicate_rows or placement != "dedicated"):
        return "chooses"
    if replicate_rows and (mode != "hybrid" or device != "cpu"):
        return "hot rows"
    if (consistency != "bsp" or cache_rows) and (
            mode not in ("hybrid", "ps") or placement != "dedicated" or replicate_rows > 0
            or device != "cpu"):
        return "only with --mode hybrid or ps"
    if placement == "colocated" and mode == "allreduce":
        return "no table shards"
    if placement == "colocated" and servers is not None:
        return "puts a shard"
    if servers and mode == "allreduce":
        return "uses no server"
    return None


def test_the_allowed_combinations_are_the_old_rules():
    for combo in itertools.product(MODES, PLACEMENTS, (None, 0, 2), (0, 8), ("bsp", "ssp:2"),
                                   (0, 16), ("cpu", "cuda")):
        old, new = _old_refusal(*combo), refusal(*combo)
        assert (old is None) == (new is None) and (old is None or old in new), (combo, new)


def test_the_strategies_meet_their_declared_interfaces():
    from pshybrid.modes import DenseStrategy, SparseStrategy
    from pshybrid.modes.dense import DENSE
    from pshybrid.modes.sparse import SPARSE

    assert set(SPARSE) | set(DENSE) == {m.sparse for m in MODES.values() if not m.chosen} | {
        m.dense for m in MODES.values() if not m.chosen}
    for proto, classes in ((SparseStrategy, SPARSE.values()), (DenseStrategy, DENSE.values())):
        methods = _methods(proto)
        assert len(methods) > 10
        for cls in classes:  # the flags are set per instance: Mode asserts those when built
            assert [m for m in methods if not callable(getattr(cls, m, None))] == [], cls


def _methods(proto) -> list[str]:
    return sorted({n for base in proto.__mro__ if getattr(base, "_is_protocol", False)
                   for n, v in vars(base).items() if callable(v) and not n.startswith("_")})


def test_the_staleness_and_hot_row_wrappers_are_sparse_strategies():
    """Also as Python 3.12's isinstance sees them: each protocol member found statically
    (``inspect.getattr_static``), not through ``__getattr__`` (3.12+ stopped every
    --replicate-rows run on ``Mode``'s assert)."""
    import inspect

    from pshybrid.modes import SparseStrategy
    from pshybrid.modes.hot import HotReplicated
    from pshybrid.modes.sparse import ServerSparse
    from pshybrid.modes.stale import StaleReads

    inner = ServerSparse.__new__(ServerSparse)  # its flags, as its __init__ sets them
    inner.live, inner.server_step = False, True
    members = [n for c in SparseStrategy.__mro__ if c.__module__ == SparseStrategy.__module__
               for n in (*vars(c), *c.__annotations__) if not n.startswith("_")]
    assert "grads_for" in members and "live" in members
    for wrapped in (StaleReads(inner, None, None), HotReplicated(inner, None)):
        assert isinstance(wrapped, SparseStrategy)
        for name in members:
            inspect.getattr_static(wrapped, name)  # (AttributeError: only by __getattr__)
    wrapped = StaleReads(inner, None, None)
    assert (wrapped.live, wrapped.server_step, wrapped.prepare_uses_mpi) == (False, True, True)
    assert wrapped.grads_for.__func__ is ServerSparse.grads_for  # the inner's
    assert wrapped.state.__func__ is ServerSparse.state
