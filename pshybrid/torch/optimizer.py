"""``DistributedOptimizer``: a torch optimizer's step as the native step sequence.

The model's dense parameters are registered in a ``ParamSpace`` (named as
``model.named_parameters()``); its flat gradient buffer is the one the dense Allreduce
reduces in place. A post-accumulate-grad hook per parameter moves a finished gradient into
its span of that buffer (on CPU the parameter's ``.grad`` then *is* that span, so later
steps accumulate straight into it) and reports it to ``GradBuckets``, which starts the
Allreduce in buckets while backward still runs, in reverse order, as the native path does.
``step()`` runs ``Mode.update``: the servers get the step's embedding-row gradient sums,
the Allreduce completes, the gradients are averaged over the workers and the torch
optimizer steps, and the step returns once every update is visible (BSP). Until then a
parameter's ``.grad`` holds this worker's own gradient; ``synchronize()`` completes the
Allreduce early, so that ``.grad`` holds the average (to clip it) before ``step()``.
Backward passes inside ``no_sync()`` accumulate without reporting (gradient accumulation):
the step's last backward, outside it, reports the sums.

Loss convention: each worker's loss is the mean over its local batch, so the sum over
workers divided by W is the global batch's mean: dense and embedding gradients are both
scaled by 1/W, and W workers x batch b == 1 worker x batch W*b.
"""

from __future__ import annotations

import contextlib
import sys
import zlib

import numpy as np
import torch
from mpi4py import MPI

from pshybrid.errors import ConfigError, PshybridError
from pshybrid.layers import ParamSpace
import pshybrid.torch.amp as amp
import pshybrid.torch.preempt as stops
from pshybrid.torch.census import census
from pshybrid.torch.restore import (apply_settings, load_dense, settings_drift,
                                    warn_inner_scheduler, warn_no_checkpoint)
from pshybrid.torch.session import DTYPES, session, shutdown
from pshybrid.transport import abort_on_error, agree, same_arguments

class DistributedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` that steps ``torch_optimizer`` (over ``model``'s
    parameters) and the job's tables as the native step does. Its ``param_groups`` are the
    torch optimizer's (the same dicts) followed by one group of its own, ``"embeddings"``
    (no torch parameters; ``lr`` the tables' ``pt.Table`` lr): an lr scheduler on it sets
    the rates of both, and the servers' sparse optimizer steps with the embeddings group's
    ``lr`` of the moment. Construction (collective over the workers) broadcasts worker 0's
    parameters and, after ``pt.init(resume=...)``, loads the checkpoint's dense weights and
    state. ``find_unused_parameters`` (as DDP's): each step, a parameter that no worker's
    backward reached gets ``.grad`` None, so the torch optimizer skips it as plain PyTorch
    does (one small Allreduce a step); without it, it is stepped with a zero gradient."""

    def __init__(self, torch_optimizer, model: torch.nn.Module, bucket_mb: float = 1.0,
                 find_unused_parameters: bool = False):
        s = session()
        if s.optimizer is not None and (s.optimizer.reduced or s.optimizer.held):
            with abort_on_error(s.topo.world):  # (this worker's backward: not collective)
                raise ConfigError("DistributedOptimizer: a backward of the current one has "
                                  "not been stepped (its Allreduce may be on the wire, or "
                                  "its gradients accumulated under no_sync): call its "
                                  "opt.step() first (opt.zero_grad() where a GradScaler "
                                  "skipped the step), then make the new one")
        if isinstance(torch_optimizer, torch.optim.LBFGS):  # (its step() needs the closure)
            raise ConfigError("DistributedOptimizer: torch.optim.LBFGS evaluates the loss "
                              "and gradients several times in one step, the workers average "
                              "them once a step: use another optimizer", collective=True)
        warn_inner_scheduler(s, torch_optimizer)
        self.built = False  # (torch's __init__ adds the groups through add_param_group)
        super().__init__(torch_optimizer.param_groups, torch_optimizer.defaults)
        self.state = torch_optimizer.state  # shared: the torch optimizer's step fills it
        # (a new phase: the previous one's rate, as its scheduler left it; step() sends it)
        self.sparse_lr = s.sparse_opt.lr if s.optimizer is None else s.optimizer.sparse_lr
        self.flag = torch.zeros(1)  # (``amp``: the GradScaler's check of the tables)
        self.s, self.opt, self.model = s, torch_optimizer, model
        self.param_groups.append(self._embeddings_group(torch_optimizer))
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        params = self.params = ParamSpace()
        for n, p in self.named:
            params.add(n, tuple(p.shape), "zeros")
        params.build(np, np.dtype(self._check_params()), 0)
        self.on_cpu = all(p.device.type == "cpu" for _, p in self.named)
        self.flat_grad = torch.from_numpy(params.flat_grad)
        self.reduced: set[str] = set()  # parameters whose gradient this step has (``step``)
        self.held: set[str] = set()  # ... reached only by backward passes inside ``no_sync``
        self.accumulating = False  # inside ``no_sync``: gradients stay on this worker
        self.unused: set[str] = set()  # no worker reached these this step (``_find_unused``)
        self.flags = None  # the workers' own copy: small Allreduces outside the step's order
        self.checked = False  # its first step warned of state no checkpoint can hold
        self.find_unused = find_unused_parameters
        self.synced = False  # this step's Allreduce completed by ``synchronize``
        self.versions: dict[str, int] = {}  # each reduced .grad's version at its hook
        self.scaled = self.scaler = None  # synchronize(scaler): (batch, grads, batches), scaler
        self.kept_settings = None  # a resume: the checkpoint's param-group settings
        bucket_bytes = max(int(bucket_mb * 2**20), 1) if bucket_mb > 0 else 0
        s.mode.dense.use(self, params, bucket_bytes)  # the mode's TorchDense
        if s.optimizer is not None:   # replaced (a new phase): its hooks would still fire
            s.optimizer.close()
        self.hooks = [p.register_post_accumulate_grad_hook(self._grad_done(n))
                      for n, p in self.named]
        with abort_on_error(s.topo.world):
            census(s, "DistributedOptimizer()", s.step)
            same_arguments(s.topo.workers, "DistributedOptimizer", "worker",
                           bucket_mb=float(bucket_mb),
                           find_unused_parameters=bool(find_unused_parameters))
            self._start()
            self.flags = s.topo.workers.Dup()
        s.optimizer = self
        self.built = True

    def _embeddings_group(self, torch_optimizer) -> dict:
        """The group of the tables' rate (a new phase: the previous optimizer's of the
        moment, as its scheduler left it)."""
        prev = self.s.optimizer
        emb = {"params": [self.flag], "name": "embeddings",
               "lr": self.sparse_lr if prev is None else prev.param_groups[-1]["lr"]}
        for key in ("betas", "momentum"):  # (a scheduler cycling them expects every group's;
            if key in torch_optimizer.defaults:  # the servers' optimizer does not read them)
                emb[key] = torch_optimizer.defaults[key]
        return emb

    def add_param_group(self, param_group) -> None:
        """(torch's ``__init__`` only: a group added later would not be reduced.)"""
        if self.built:
            raise ConfigError("DistributedOptimizer.add_param_group: its parameters would not "
                              "be averaged over the workers: add the group to the torch "
                              "optimizer and make a new DistributedOptimizer of it (a new "
                              "phase)")
        super().add_param_group(param_group)

    # -- start: the same weights on every worker ------------------------------------------
    def _check_params(self) -> str:
        """Before any hook: every parameter the torch optimizer trains is the model's, and
        the model's parameters share one dtype, returned (float32 where it has none); else
        ConfigError."""
        mine = {id(p) for _, p in self.named}
        if any(p.requires_grad and id(p) not in mine
               for g in self.opt.param_groups for p in g["params"]):
            raise ConfigError("DistributedOptimizer: the torch optimizer holds a parameter "
                              "that is not one of the model's: its gradient would not be "
                              "averaged over the workers nor its state checkpointed; make "
                              "the model hold it", collective=True)
        dtypes = {p.dtype for _, p in self.named}
        if len(dtypes) > 1 or not dtypes <= set(DTYPES):
            raise ConfigError(f"DistributedOptimizer: the model's parameters must share one "
                              f"dtype, float32 or float64; found {sorted(map(str, dtypes))}",
                              collective=True)
        return DTYPES[dtypes.pop()] if dtypes else "float32"

    def _start(self) -> None:
        s = self.s
        self._check_same_model()
        self.sync_params()
        # Wire: Bcast of the flat dense parameters from worker 0 over the workers
        s.topo.workers.Bcast(self.params.flat, root=0)
        self._to_params(self.params.flat)
        if s.resume_dir is not None and s.optimizer is None:  # (a later phase: as trained)
            err = None
            try:
                load_dense(self, s.resume_dir)
            except PshybridError as e:
                err = e
            agree(s.topo.workers, err)  # Wire: verdict allgather over the workers

    def _check_same_model(self) -> None:
        """Every worker's model has the same parameters (names, shapes, dtype), else one
        ``ConfigError`` on every worker naming the first that differs (a model built
        differently per worker made the Bcast below fail with an MPI size mismatch)."""
        sig = [(n, tuple(p.shape), str(p.dtype)) for n, p in self.named]
        workers = self.s.topo.workers
        # Wire: allgather of 3 ints (parameters, elements, crc32 of the names and shapes)
        # over the workers; all wait.
        every = workers.allgather((len(sig), self.params.size, zlib.crc32(repr(sig).encode())))
        if len(set(every)) == 1:
            return
        # Wire: allgather of each worker's (name, shape, dtype) list, only when they differ
        sigs = workers.allgather(sig)
        w = next(i for i, x in enumerate(sigs) if x != sigs[0])
        k = next((i for i, (a, b) in enumerate(zip(sigs[0], sigs[w])) if a != b),
                 min(len(sigs[0]), len(sigs[w])))
        first, other = (x[k] if k < len(x) else None for x in (sigs[0], sigs[w]))
        what = (f"parameter {first[0]!r} is {first[1]} {first[2]} on worker 0, worker {w} "
                f"has {other[0]!r} {other[1]} {other[2]}" if first and other else
                f"worker 0 has {len(sigs[0])} parameters, worker {w} {len(sigs[w])}")
        raise ConfigError(f"DistributedOptimizer: the model differs between workers: {what}; "
                          "build the same model on every worker", collective=True)

    def sync_params(self) -> None:
        """params.flat <- the parameters' current values."""
        for n, p in self.named:
            self.params.param(n)[...] = p.detach().cpu().numpy()

    def _to_params(self, flat) -> None:
        with torch.no_grad():
            for n, p in self.named:
                o, k = self.params.offset(n), p.numel()
                p.copy_(torch.from_numpy(flat[o:o + k]).reshape(p.shape))

    # -- backward: gradients into the flat buffer, buckets on the wire -------------------
    def _grad_done(self, name: str):
        view = self.flat_grad[self.params.offset(name):][:int(np.prod(self.params.shape(name)))]
        view = view.reshape(self.params.shape(name))

        def hook(p):
            if self.synced:  # (its gradient would be this worker's own plus the average)
                raise ConfigError("DistributedOptimizer: a backward pass after "
                                  "opt.synchronize() and before opt.step(): step first (where "
                                  "a GradScaler skipped the step, call opt.zero_grad(), not "
                                  "model.zero_grad(), before the next backward)")
            if p.grad.is_sparse:
                raise ConfigError(f"DistributedOptimizer: parameter {name!r} has a sparse "
                                  "gradient (nn.Embedding(sparse=True)): dense parameters are "
                                  "averaged as dense arrays; use sparse=False, or pt.Table and "
                                  "pt.Embedding for a large table")
            if name in self.reduced:  # its first gradient may be on the wire already
                raise ConfigError(f"DistributedOptimizer: a second backward pass reached "
                                  f"parameter {name!r} before opt.step(): call opt.step() "
                                  "after each loss.backward() (gradients are reduced as "
                                  "backward runs; a step skipped mixes two batches, and "
                                  "opt.zero_grad() cannot take a backward back: to skip a "
                                  "batch, skip its backward); to accumulate micro-batches, "
                                  "run all but the step's last backward inside "
                                  "`with opt.no_sync():`")
            if self.on_cpu:
                if p.grad.data_ptr() != view.data_ptr():
                    view.copy_(p.grad)
                    p.grad = view  # later backward passes accumulate straight into it
            elif not self.accumulating:  # GPU: D2H of the micro-batches' sum, once a step
                view.copy_(p.grad)  # (one reached only inside no_sync: ``_unreported``)
            if self.accumulating:  # (``no_sync``: the step's last backward reports it)
                self.held.add(name)
                return
            self.reduced.add(name)
            self.versions[name] = p.grad._version  # (CPU: the flat buffer's, shared)
            self.params.grads_ready(name)
        return hook

    def _check_untouched(self) -> None:
        """A ``.grad`` changed in place since its hook (``clip_grad_norm_`` before
        ``synchronize``: on CPU the Allreduce's buffer, maybe on the wire) is refused."""
        last = max(self.versions.values(), default=None)  # (CPU: one shared counter)
        for n, p in self.named:
            if n in self.versions and p.grad is not None and p.grad._version != (
                    last if self.on_cpu else self.versions[n]):
                raise ConfigError(f"DistributedOptimizer: the .grad of {n!r} changed in place"
                                  " after loss.backward() and before opt.step() (clipped, or "
                                  "a second backward?): it is this worker's own, on the wire "
                                  "in the Allreduce; call opt.synchronize() first, then change it")

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation, as DDP's ``model.no_sync()``: backward passes inside the
        context accumulate this worker's gradients (dense and embedding) and start no
        Allreduce; the step's last backward, outside it, sends the sum, and ``step()``
        applies it. Not collective (the workers may differ in how many micro-batches they
        accumulate); divide each micro-batch's loss by their number, as in plain PyTorch."""
        if self.reduced or self.synced:
            with abort_on_error(self.s.topo.world):  # (this worker's backward: not collective)
                raise ConfigError("DistributedOptimizer.no_sync: a backward outside it (or "
                                  "opt.synchronize()) already started this step's Allreduce: "
                                  "run the step's earlier backward passes inside no_sync and "
                                  "its last one after it")
        before, self.accumulating = self.accumulating, True
        try:
            yield
        finally:
            self.accumulating = before

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the dense gradients (in place: the Allreduce's buffer, once the buckets on
        the wire are complete) and drop the embedding gradients of lookups whose backward
        already ran (a forward pass made before ``zero_grad`` keeps its lookups for the
        coming backward): a step then applies zero, dense and tables. ``set_to_none``
        (torch's default) matters with ``find_unused_parameters`` alone: ``.grad`` is set to
        None, so a parameter no worker reaches before the step is skipped, as in plain
        PyTorch (otherwise ``.grad`` stays the buffer's span, zeroed: no copy per step)."""
        if not self.s.mode.dense.settled():  # a backward's buckets on the wire (MPI forbids
            with self.s.watch.inside("opt.zero_grad()", self.s.step + 1):  # writing): timed
                self.s.mode.dense.settle()
        self.params.zero_grad()
        none = set_to_none and self.find_unused
        if none and self.on_cpu:
            for _, p in self.named:
                p.grad = None  # (the next backward's hook points it at the buffer again)
        self.held.clear()
        self.versions.clear()
        if self.synced:  # a step not taken (a GradScaler's skip): nothing is on the wire
            self.reduced.clear()
            amp.drop_scaled(self)
        self.synced = False
        if not self.on_cpu:
            self.opt.zero_grad(set_to_none=none)
        self.s.drop(lambda entry: entry[2] is not None)  # (its backward ran)

    # -- the step ----------------------------------------------------------------------------
    def step(self, closure=None):
        """One training step (collective over the workers); ``closure`` (optional) is
        called first, with gradients on, and its loss returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        s = self.s
        with abort_on_error(s.topo.world), s.watch.inside("opt.step()", s.step + 1):
            if s.optimizer is not self:
                raise ConfigError("DistributedOptimizer.step: a newer DistributedOptimizer "
                                  "replaced this one in the session; step that one",
                                  collective=True)
            amp.check_stepped_by_scaler(self)  # (before anything reaches the servers)
            if not self.synced:
                self._check_untouched()
            self._check_settings()
            lr = float(self.param_groups[-1]["lr"])
            if lr != self.sparse_lr:  # a scheduler changed it: the servers' optimizer too
                s.mode.set_sparse_lr(lr)
                self.sparse_lr = lr
            batch, demb, used = self.scaled or self._sparse_batch()
            used = used + [e[1] for e in s.entries]  # (lookups since synchronize too)
            self.scaled = self.scaler = self.flag.grad = None
            if not self.synced:
                self._unreported()
                self._find_unused()
            s.mode.update(batch, demb, s.step + 1)
            for b in used:
                b.release()
            s.entries = []
            self.reduced.clear()
            self.held.clear()
            self.versions.clear()
            self.synced = False
            s.step += 1
            stepped_on = stops.after_step(s)  # Wire: the stop agreement (``preempt``)
        if stepped_on:  # a stop was requested at an earlier step: the run ends here
            stops.stepped_on(s)
            shutdown()
        return loss

    def restore_settings(self) -> None:
        """After a resume: each param group's settings as the checkpoint has them again (the
        ``DistributedOptimizer`` set them when made; a scheduler made on it since reset
        them): call it after ``sched.load_state_dict(...)``, as plain PyTorch loads the
        optimizer's state after making the scheduler. Without a resume: nothing."""
        if self.kept_settings is not None:
            apply_settings(self.param_groups, self.kept_settings)

    def _check_settings(self) -> None:
        """The first step after a resume: worker 0 warns where a setting differs from the
        checkpoint's (a scheduler's constructor reset it, ``restore_settings`` not called)."""
        kept, self.kept_settings = self.kept_settings, None
        drift = settings_drift(self.param_groups, kept) if kept else None
        if drift and self.s.topo.worker_index == 0:
            sys.stderr.write(f"pshybrid: warning: at the first step after the resume, {drift}: "
                             "a scheduler made after the DistributedOptimizer resets the "
                             "rates; call opt.restore_settings() after sched.load_state_dict"
                             "(...) (a setting you changed on purpose: ignore this)\n")

    def synchronize(self, scaler=None) -> None:
        """Workers, collectively, after backward and before ``step()``: complete the dense
        gradients' Allreduce now and average it, so each parameter's ``.grad`` holds what
        ``step()`` applies (the same on every worker) and can be read or changed first:
        ``torch.nn.utils.clip_grad_norm_`` clips the global gradient after this call (before
        it, ``.grad`` is this worker's own, and a bucket may be on the wire).

        ``scaler``: a ``torch.amp.GradScaler``'s loop (``pshybrid.torch.amp``)."""
        s = self.s
        with abort_on_error(s.topo.world), s.watch.inside("opt.synchronize()", s.step + 1):
            if s.optimizer is not self or self.synced or self.accumulating:
                raise ConfigError("DistributedOptimizer.synchronize: once per step, after its "
                                  "last backward (outside no_sync), on the session's newest "
                                  "DistributedOptimizer", collective=True)
            scaling = scaler is not None and scaler.is_enabled()
            if scaling:
                amp.check_ready(scaler, self)
            self._check_untouched()
            self._unreported()
            self._find_unused()
            s.mode.dense.reduce_now(s.step + 1)
            self._average()
            self.synced = True
            if scaling:
                self.scaled = amp.unscale_tables(self, float(scaler.get_scale()))
                self.scaler = scaler

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """``torch.amp.GradScaler.step`` asks this first: refused unless ``synchronize
        (scaler)`` ran (unscaling each worker's own, partly reduced gradients, and the
        tables' not at all, trained on gradients ``scale`` times too large)."""
        if self.scaled is None and amp.called_by_a_scaler():
            with abort_on_error(self.s.topo.world):
                raise ConfigError("DistributedOptimizer with a GradScaler: call "
                                  "opt.synchronize(scaler) after the backward and before "
                                  "scaler.unscale_(opt) / scaler.step(opt)", collective=True)
        return False

    def _unreported(self) -> None:
        """The gradient spans of the parameters no backward outside ``no_sync`` reported:
        zero where this step's backward did not reach them (they hold an earlier step's
        where ``model.zero_grad()``, not ``opt.zero_grad()``, dropped the ``.grad``
        tensors, and would be reduced and applied again); on a GPU, the sum of those
        reached only inside ``no_sync``, copied now (their hooks left it on the device)."""
        for n, p in self.named:
            if n in self.reduced:
                continue
            if not self._reached(n, p):
                self.params.grad(n)[...] = 0
            elif not self.on_cpu:
                self.params.grad(n)[...] = p.grad.detach().cpu().numpy()

    def _reached(self, name: str, p) -> bool:
        """Whether this step's backward reached ``name`` (inside ``no_sync`` too, unless
        ``model.zero_grad()`` dropped that gradient since)."""
        return name in self.reduced or (name in self.held and p.grad is not None)

    def _find_unused(self) -> None:
        """With ``find_unused_parameters``: the parameters no worker reached this step."""
        if not self.find_unused:
            return
        reached = np.array([self._reached(n, p) for n, p in self.named], np.int32)
        # Wire: Allreduce(MAX) of one int32 a parameter over the workers (their own copy of
        # the workers' communicator: never matched with a step's buckets); all wait
        self.flags.Allreduce(MPI.IN_PLACE, reached, op=MPI.MAX)
        self.unused = {n for (n, _), r in zip(self.named, reached.tolist()) if not r}

    def _sparse_batch(self):
        """The step's lookups as one Batch and its (n, E) gradients (scaled by 1/W)."""
        s = self.s
        E, dtype = s.layout.table.dim, np.dtype(s.layout.table.dtype)
        done = [e for e in s.entries if e[2] is not None]
        used = [e[1] for e in s.entries]
        W = s.topo.n_workers
        if len(done) == 1 and done[0][3]:  # (its own Batch serves the push)
            ids, batch = done[0][:2]
        else:
            ids = np.concatenate([d[0] for d in done]) if done else np.zeros(0, np.int64)
            batch = s.mode.prepare(ids)
            used.append(batch)
        demb = np.zeros((ids.size, E), dtype)
        k = 0
        for _, _, g, _ in done:
            demb[k:k + g.shape[0], :g.shape[1]] = g
            k += g.shape[0]
        if W > 1:
            demb *= 1.0 / W
        return batch, demb, used

    def apply_dense(self) -> None:
        """At the sync point: the summed gradients averaged (unless ``synchronize`` did),
        the torch optimizer's step."""
        if not self.synced:
            self._average()
        self.opt.step()
        if not self.checked:  # (the state a checkpoint must hold exists from here)
            self.checked = True
            warn_no_checkpoint(self)

    def _average(self) -> None:
        """The reduced sums / W into every parameter's ``.grad``."""
        W = self.s.topo.n_workers
        if W > 1:
            self.flat_grad.mul_(1.0 / W)
        for n, p in self.named:
            if p.grad is None and n in self.unused:
                continue  # reached by no worker, .grad None: skipped, as in plain PyTorch
            if not self.on_cpu or p.grad is None:  # (GPU: H2D; a worker that did not reach
                #   it: the workers' average, zero where none did)
                p.grad = torch.from_numpy(self.params.grad(n)).to(p.device)

    # -- checkpoints ----------------------------------------------------------------------
    def _buffers(self) -> dict:
        """The model's buffers a ``state_dict`` holds (a BatchNorm's running statistics)."""
        kept = self.model.state_dict(keep_vars=True)
        return {n: b for n, b in self.model.named_buffers() if n in kept}

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        amp.drop_scaled(self)  # (a step the scaler skipped, at shutdown)
        if self.flags is not None:
            self.flags.Free()  # (collective: the next DistributedOptimizer's construction)
            self.flags = None

    # -- torch's optimizer state ------------------------------------------------------------
    def state_dict(self):
        """The torch optimizer's, and ``"embeddings"``: the embeddings group's settings."""
        out = self.opt.state_dict()
        out["embeddings"] = {k: v for k, v in self.param_groups[-1].items() if k != "params"}
        return out

    def load_state_dict(self, state_dict) -> None:
        state_dict = dict(state_dict)
        emb = state_dict.pop("embeddings", {})
        self.opt.load_state_dict(state_dict)  # (new group dicts: share them again)
        self.param_groups[:-1] = self.opt.param_groups
        self.state = self.opt.state
        self.param_groups[-1].update(emb)
