"""The message catalogue: every sentence a finding's evidence and recommendation, and a summary's notes, are
made of, each named by a stable code. The library builds records, `{"code": ..., "params": {...}}`, and
renders them into text only where text is shown (the printed summary, warnings, `leakdoctor report`); a
program reads the codes and their parameters, a person the text. On the ground floor because the rules
(integrations/), the judging and the reporting all build records.

A template is `str.format` text over the record's params. A param is a plain value (a name, a number, a
step), a record (rendered in its place), a list of records (rendered one after the other), or None (nothing).
A format spec that names a unit (`{growth:bytes}`) reads the number in that unit (1.5 MiB); `{growth:unit}`
reads it in the unit the params name (`unit`). Other specs read a list: `join` (names), `quoted` (names of
code), `sizes` (bytes), `parts` (records joined by '; '), a census's rows (_ROWS), a count with its noun
(_NOUNS). A location is `{"file", "line", "function", "holder"}`
(None where unknown), rendered by `location_text`.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Iterator
from typing import Any

from leakdoctor._base.units import UNITS, format_value

__all__ = ["MESSAGES", "Record", "msg", "render", "render_all", "records", "find", "codes", "unique", "legacy",
           "LOCATION_FIELDS", "Location", "location", "parse_location", "location_text"]

#: A message: its code and the parameters its template reads.
Record = dict[str, Any]
#: Where a finding stands: a file and line, the function, the holder (a variable, an attribute).
Location = dict[str, Any]
LOCATION_FIELDS = ("file", "line", "function", "holder")

MESSAGES: dict[str, str] = {
    # text a file of the old schema (leakdoctor.summary/1) holds: prose, read as it is
    "text": "{text}",
    # ---- a growth, as a window saw it (_base/evidence.py)
    "grew": "{metric} grew {growth:unit} in {steps} steps ({pace:unit}/step{trend})",
    "trend_rate": "; {rate:unit}/step over the windows that raised the suspicion",
    # ---- PyTorch (integrations/_torch.py)
    "survived_empty_cache": "{growth} and survived gc and empty_cache(){kept}",
    "store_item_or_cpu": "tensors on the device are kept from step to step: look for results stored across steps "
                         "(lists, dicts, attributes) and store .item() or .cpu() copies",
    "torch_cache": "{growth} while {allocated} stayed flat: PyTorch's caching allocator keeps freed blocks for "
                   "reuse{took_back}{retries}",
    "empty_cache_took_back": "; empty_cache() took it back",
    "retries_rose": "; allocation retries rose by {count:g} (fragmentation)",
    "expandable_segments": "not a leak; if retries keep rising, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                           "or call torch.cuda.empty_cache() now and then (remedy clear_cache)",
    "cache_reused": "not a leak: the cache is reused; nothing to do",
    "hooks_differ": "{growth}, each a different function{step_time}",
    "register_hooks_once": "register hooks once, outside the training loop, or keep each handle and call "
                           "handle.remove() when it is done",
    "hooks_held": "{growth}; {module} holds {count} {kind}s running {function}{more}{step_time}",
    "more_hook_tables": " ({count} more hook tables hold repeats)",
    "register_hook_once": "register {function} once, outside the training loop, or keep the handle that "
                          "register_*_hook returns and call handle.remove() after the step",
    "workers_copied": "{growth}: the forked DataLoader workers have copied {copied:bytes} of the {pages:bytes} of "
                      "pages holding {holder}, {description}, pages they only read: each read writes the object's "
                      "reference count, so the page holding it is copied into the worker (copy-on-write, "
                      "pytorch#13246), until each worker holds a copy of all of it{alone}",
    "python_container": "a Python {kind} of {count} objects ({item}, ...)",
    "workers_alone_grew": "; what the workers hold alone grew {size:bytes} since they started",
    "workers_read_container": "{growth}; the DataLoader workers read {holder}, a Python {kind} of {count} objects: "
                              "each read writes the object's reference count, so the page holding it is copied "
                              "into the worker (copy-on-write, pytorch#13246)",
    "getitem_stores": "{growth} in the DataLoader workers' memory of their own; {dataset}.__getitem__, which each "
                      "worker runs on its own copy of the dataset, stores into {holder} ({line}): every sample a "
                      "worker loads is kept in its copy of the {kind}, which grows until the worker ends (here it "
                      "holds {count} items, as the workers' copies did when they started)",
    "no_samples_on_dataset": "do not keep samples on the dataset in __getitem__: each worker keeps its own copy of "
                             "{holder}, none of which the training loop sees; cache in the main process, or "
                             "preprocess once into a numpy array or a memory-mapped file before the DataLoader starts",
    "loader_advice": "store {holder} as a numpy array (numbers, or fixed-width strings), an Arrow table or a "
                     "memory-mapped file instead of a Python {kind}, so the workers read buffers and write no "
                     "reference counts; persistent_workers=True keeps the workers, and their copies, from one "
                     "epoch to the next (the memory stays held all run but is not copied again), while the default "
                     "False frees it at each epoch's end and copies it again in the next",
    # ---- Python (integrations/_python.py, _holders.py)
    "keep_scalar": "{value}.detach() or {value}.item()",
    "keep_detached": "{value}.detach() (or a summary of it, such as {value}.mean().item())",
    "keep_either": "{value}.detach() or {value}.item() (where it is a single number)",
    "allocations_growing": "; allocations growing at {site} (+{size:bytes})",
    "objects_growing": "; live objects growing: {types:gained}",
    "small_history": "not a leak: {growth}{held}, a history too small to matter over the run, and step time is flat",
    "holding_about": ", holding about {size:bytes}",
    "container_grew": "{growth}{items}{step_time}{allocated}",
    "new_items": ", about {size:bytes} of new items",
    "lead": "{what}: ",
    "bound_or_clear": "{stores}bound or clear {holder} (clear it at epoch end, keep a fixed-size deque, or store "
                      "summaries instead of objects)",
    "items_keep_graphs": "{growth}; its new items are tensors with grad_fn, each keeping its step's autograd graph",
    "store_detached": "{stores}store {instead} in {holder}, not the tensor with its autograd graph (or compute it "
                      "under torch.no_grad()), and clear {holder} once it is used{remedy}",
    "detach_unreachable": "; detach_retained cannot act: the container holding the tensors could not be reached again",
    "allow_detach": "; remedies='all' (or ['{remedy}']) detaches the kept tensors in place after every step",
    "graph_tensors": "tensors with grad_fn (each keeps its step's autograd graph, and the activations it saved, alive)",
    "objects_of_size": "{kind} objects of about {size:bytes} each",
    "stores": "the {kind} {holder} stores {what}",
    "cpu_rising": "; CPU time per step rising by {rate:seconds}/step",
    "collector_on": "not a leak: {growth}, garbage that Python's garbage collector, which is on, frees at its next "
                    "full collection; gc.collect() took it back",
    "cycles_pile_up": "{growth}; gc.collect() took it back: objects in reference cycles pile up and the garbage "
                      "collector does not run (gc disabled, or its threshold 0){census}",
    "cycle_census": "; garbage in cycles: {garbage:created}",
    "break_cycles": "break the reference cycles (weakref for back-references, del the closure), or collect "
                    "periodically (remedy gc_collect does gc.collect() within a 1% time budget)",
    "allocations_survived": "{growth}; {size:bytes} in {count} live allocations made at {site} during the window "
                            "survived gc.collect(){types}",
    "find_who_holds": "something created at {site} is kept from step to step: find who holds it (a list, a dict, a "
                      "closure, a global) and drop or bound it",
    # ---- kept autograd graphs and tensors (integrations/_torch_graphs.py)
    "graphs_kept": "tensors with grad_fn kept across {steps} steps: {groups:tensors}",
    "graph_grew": "autograd graph grew by {nodes} nodes",
    "held_by_counted": "held by {holders:holders}",
    "gained_on": "; tensors gained on {device}: {groups:counted}",
    "store_detached_last": "{stores}store {instead} in {holder}, not the tensor with its autograd graph (or compute "
                           "it under torch.no_grad())",
    "add_detached": "{stores}add {instead} to {holder}, not the tensor with its autograd graph (or compute it under "
                    "torch.no_grad()){remedy}",
    "graphs_census": "{growth:parts}; {census:parts}",
    "bound_tensors": "{stores}bound or clear {holder} (keep the last few, store .item() or summaries instead of "
                     "tensors, or clear it at epoch end)",
    "tensors_kept": "{growth}, survived cleanup; tensors without grad_fn kept across {steps} steps: {groups:tensors}; "
                    "held by {holders:join} (torch allocates their storage outside Python's allocator: Python's "
                    "objects grow by an entry a step, resident memory by the tensors' bytes)",
    "stores_tensors": "the {kind} {holder} stores tensors {tensors}: ",
    "stores_graphs": "the {kind} {holder} stores tensors with grad_fn{tensors}, each keeping its step's autograd "
                     "graph and the activations it saved: ",
    "tensors_in_parens": " ({tensors})",
    "holds_chain": "{holder} holds a tensor with grad_fn whose autograd graph chains every step's graph to the last: ",
    "detach_no_holder": "; detach_retained cannot act: no place in the program (an attribute of the model or of "
                        "your objects, a variable of the training loop, a global) was found holding the kept tensors",
    "no_growth_of_its_own": "{metric} showing no growth of its own in this window (a chain's nodes are small)",
    "gaining_graph_bytes": "{metric} gaining at least the kept graphs' {rate:bytes}/step",
    "growing_by": "{metric} growing by {rate:unit}/step",
    "graphs_in": "{count} tensors with grad_fn in {holder}",
    "chains_nodes": "{holder} holds a tensor whose autograd graph chains {nodes} nodes, about one a step",
    "last_look": "at the end of the run, {what} (a look at what was alive when it ended: the growth was too slow or "
                 "too short to raise a suspicion)",
    # ---- JAX (integrations/_jax.py)
    "lax_cond": "lax.cond at {site} ({function}; branches {branches:join})",
    "compile_facts": "{facts:parts}",
    "compiled_in_window": "compiled in the window: {functions:compiled}",
    "executables_cached": "{growth}, the compiled executables stay cached",
    "cond_retraced": "the optimizer's {cond} has branches that are new closures on every call, so outside jax.jit "
                     "every update traces and compiles the cond again",
    "jit_the_update": "jit the update (jax.jit on the training step, or on tx.update), which compiles the cond once; "
                      "or write its branches with jnp.where. remedies='all' applies cond_to_where: the optimizer's "
                      "update with every cond turned into a select_n (same results, no compile per step)",
    "traced_again": "{function} was traced again {count}x: {reason}",
    "called_at": "called at {site}",
    "trace_once": "make {function} trace once: pass values that change every step (a learning rate, a step count) "
                  "as arrays (jnp.asarray(x)) instead of static arguments, Python scalars in closures or changing "
                  "shapes; define it once, outside the loop",
    "jit_once": "jit the training step once, keep shapes and static arguments fixed, and define jitted functions "
                "outside the loop; jax.config.update('jax_explain_cache_misses', True) tells why jax traces again",
    "compile_fix": "{fix}{bound}",
    "compiled_from": "{function} compiled from {site}",
    "clear_caches_bound": ". remedies='safe' bounds the memory with jax.clear_caches() (clear_cache), at the price "
                          "of compiling again",
    "scalar_history": "not a leak: {growth}, holding {size:bytes}, a history of scalars too small to matter over "
                      "the run",
    "accumulating": "; accumulating: {arrays:arrays}",
    "held_by": "; held by {holders:join}",
    "store_floats": "store Python floats in {holder} (float(x)) or keep it bounded",
    "store_floats_anywhere": "store Python floats (float(loss)) or a bounded history",
    "survived_gc": "{growth}, survived gc.collect(){kinds}{held}",
    "jax_arrays_kept": "arrays are kept from step to step (a list of losses or metrics as jax arrays, a dict of "
                       "outputs, a growing cache): {where}, and drop references to per-step outputs",
    # ---- Keras (integrations/_keras.py)
    "new_models": "{count} new models in {calls} calls of {where}",
    "model_compiles": "{growth}; {models}: a new model compiles its own train/predict functions",
    "reuse_model": "not a leak: a new model compiles once; reuse one model (model.set_weights) if the compile "
                   "time matters",
    "model_holds": "; each model holds {size:bytes} (variables and optimizer state)",
    "per_new_model": "; memory grew {growth:bytes} per new model, which holds {size:bytes} (variables and "
                     "optimizer state)",
    "also": "; {growth}",
    "refaulted": "; what survived the cleanups is pages that malloc_trim gave back, touched again (malloc's bytes "
                 "in use stayed level)",
    "models_settle": "{growth}{also}; {models}{size}: the models do not pile up, the C heap settles around models "
                     "that come and go{refault}",
    "models_freed": "not a leak: each old model is freed at the next garbage collection",
    "models_held_by": ": held by {holder}",
    "models_held_unknown": " (kept in a list or dict, or by the History objects that fit() returns: History.model "
                           "is the model)",
    "models_referenced": "; {count} old models are still referenced after gc.collect(){held}",
    "do_not_keep_models": "do not keep each model in {holder}; ",
    "drop_old_models": "drop the references to old models ({keep}keep history.history, the dict, not the History "
                       "object), then call keras.backend.clear_session() before building each new model",
    "gc_took_back": "gc.collect() took it back",
    "collected_then_trimmed": "Python's own full collection freed the old models just before the ladder, and "
                              "malloc_trim took it back",
    "models_in_cycles": "; {taken}: a Keras model sits in reference cycles, which only a full garbage collection "
                        "frees, and Python runs one rarely on a heap this large, so old models (up to {count} at a "
                        "time here) and what they hold stay, and the C heap fragments around them",
    "not_given_back": "; the old models' memory is not given back",
    "clear_session_or_del": "call keras.backend.clear_session() before building each new model (it resets Keras's "
                            "global state and runs a full gc.collect()), or `del model; gc.collect()` after each",
    "models_freed_memory_grew": "; the old models were freed, yet memory kept growing with each new one",
    "clear_session_caches": "call keras.backend.clear_session() before building each new model: it also resets the "
                            "backend's caches (TensorFlow's graph and kernel cache, torch.compile's cache)",
    "models_kept": "{growth}{also}; {models}{size}{why}{census}",
    "clear_session_remedy": "{advice}; remedies='all' calls clear_session between calls (clear_session)",
    "jax_says": "; jax says: {reason}",
    "executable_kept": "; {growth}: each compiled executable is kept",
    "keras_compiled": "{growth}; Keras compiled {functions:join} {count}x in {steps} steps of {where} with the same "
                      "model: a new input shape every time{reason}{memory}",
    "fixed_shapes": "{calls} compiles its step function once per input shape: give it inputs of a few fixed shapes "
                    "(pad or bucket them to a fixed batch size, or batch them and call once); remedies='safe' bounds "
                    "the memory with jax.clear_caches() (clear_cache), at the price of compiling again",
    # ---- MLX (integrations/_mlx.py)
    "active_grew": "; MLX active memory grew too ({growth:bytes})",
    "active_flat": "; MLX active memory stayed flat ({growth:bytes} in {steps} steps)",
    "state_not_evaluated": "{growth}{active}; {state} were still not evaluated {steps} steps later: every "
                           "optimizer.update chains onto a graph that is never computed, so the whole history stays "
                           "in memory (and is computed at once, in a spike, when something finally evaluates it)",
    "eval_state_after_call": "evaluate the state after each call of {function}(): mx.eval({state}) right after it "
                             "(at {site}), outside the function (no mx.eval inside an mx.compile'd one); remedy "
                             "force_eval does this when remedies='safe'",
    "eval_state_after_update": "evaluate the state after each update: mx.eval({state}) right after optimizer.update "
                               "(at {site}); remedy force_eval does this when remedies='safe'",
    "never_evaluated": "{growth}; never evaluated and rebuilt from its previous value every step: {names:quoted}; "
                       "the graph ({edges} edges behind `{name}`) chains across steps and keeps every step's inputs "
                       "alive",
    "eval_chain": "evaluate `{name}` every step, with the state: mx.eval({state}, {expr}), or accumulate a Python "
                  "number (.item()); or pass it to the doctor, doctor.step({key}={expr}), and remedies='safe' "
                  "evaluates it each step (force_eval)",
    "sampled_held_by": "; of {sampled} new ones sampled, held by {holders:holders}",
    "arrays_gained": "; arrays gained: {arrays:arrays}",
    "kept_lazy": "{growth}{kinds}{held}; {lazy} of the {sampled} never evaluated: each keeps its unevaluated graph "
                 "and everything the graph reads (the step's inputs, the parameters of its step)",
    "store_numbers_or_eval": "store Python numbers in {holder} (x.item()), or evaluate what you store (mx.eval) and "
                             "keep it bounded; force_eval evaluates the model and optimizer state, not {holder}",
    "survived_cleanup": "{growth}, survived cleanup{kinds}{held}",
    "store_numbers": "arrays are kept from step to step: store Python numbers in {holder} (x.item()) or keep it "
                     "bounded, and drop references to per-step outputs",
    "grew_by": "{metric} grew by {count}",
    "traced": "{growth}{memory}; the mx.compile'd function {function} was traced {count} times in {steps} "
              "steps{changing}: each call with an input shape, dtype or Python constant it has not seen compiles a "
              "new graph, and MLX keeps every one in its compile cache",
    "arguments_changing": ", its arguments changing: {arguments}",
    "shapeless": "compile {function} with mx.compile(..., shapeless=True) if only dimension sizes change (it then "
                 "traces once for any size), or pad its inputs to a few bucket sizes so it traces once per bucket; "
                 "pass changing Python values as arrays; never create compiled functions inside the loop",
    "mlx_cache": "{growth}{active}; mx.clear_cache() took it back: MLX keeps freed buffers for reuse and, when "
                 "shapes vary, a buffer of every size it has seen, up to the cache limit",
    "cap_cache": "not a leak; if the memory is needed elsewhere, cap the cache with mx.set_cache_limit(bytes) "
                 "(remedy cap_cache sets it from the measured working set) rather than calling mx.clear_cache() "
                 "every step, which slows fixed-shape training",
    # ---- worker processes (integrations/_process.py)
    "shared_pages": "not a leak of the workers' own: {growth}, in pages they shared with this process (their new "
                    "anonymous memory grew {new:bytes}): copy-on-write of what they share, at most all of it (they "
                    "hold {sizes:sizes} alone)",
    "workers_grew": "{growth} across {workers} worker process(es), which now hold {sizes:sizes} alone{new}",
    "new_of_their_own": "; {size:bytes} of it new memory of their own",
    "workers_keep": "look at what the workers keep from one sample to the next (a list or cache on the dataset, a "
                    "module-level dict); workers touching Python objects (lists, dicts of str/int) write their "
                    "reference counts and so copy every page they read (pytorch#13246): keep the dataset in numpy "
                    "arrays, Arrow tables or a memory-mapped file",
    # ---- the pytest plugin (pytest_plugin.py)
    "test_step_kept": "{metric}, the bytes allocated and still alive after each step ({meaning}), grew by "
                      "{rate:bytes}/step through the last {steps} steps, and a gc.collect() kept the growth{site}",
    "allocated_at": "; what grew was allocated at {site}",
    "step_keeps": "the step keeps what it allocates: find who holds it (a list, a dict, a closure, a global, a cache "
                  "without a bound) and drop or bound it",
    # ---- notes: a prefix, then what is said
    "at_step": "step {step}: {note}",
    "not_a_leak": "not a leak: {why}",
    "came_back": "{cause} on {metric} came back after {remedy}",
    "did_not_stop": "{remedy} did not stop {cause} on {metric}",
    "snapshot_needs_torch": "oom_snapshot={path!r}: needs torch with CUDA (pip install leakdoctor[torch]); nothing "
                            "recorded",
    "no_cuda_snapshot": "oom_snapshot={path!r}: CUDA is not available, so there is no allocator history to record",
    "resident_memory": "resident memory",
    "limit_figure": "{figure} (the figure the limit counts)",
    "watermark_passed": "{what} reached {used:bytes}, {share:.0%} of the memory limit ({limit:bytes}, {source}), past "
                        "oom_watermark={watermark:g}: the post-mortem summary is written at once",
    "not_seen_on_rank": "rank {rank}: {cause} on {metric} (not seen on rank {first})",
    "rank_asked_to_stop": "rank {rank} asked to stop at step {step}: {reason}",
    "in_process": "process {pid}: {note}",
    "steps_in_children": "the script's steps were taken in forked child processes: this summary is process {pid}'s, "
                         "with what the others found",
    "child_finding": "{cause} on {metric} ({state})",
    "forked_children": "{count} forked child process(es) were watched too: {children:children}",
    "collected": "finish() was never called: the doctor was finished when it was garbage-collected, at step {step}",
    "ended": "the run ended with {error} at step {step}",
    "ended_with": "the run ended with {error}",
    "never_finished": "finish() was never called, and the doctor was finished {how}",
    "at_exit": "at interpreter exit",
    "when_collected": "when it was garbage-collected",
    "on_signal": "on {signal}",
    "not_gathered": "{why}: the summaries of the other {others} rank(s) were not gathered (they may never reach the "
                    "collective), so this summary is rank {rank}'s alone",
    "earlier_fits": "steps 1-{steps} were earlier fits with this callback: their findings are kept, the series are "
                    "this fit's",
    "nan_readings": "{metric} read NaN or inf {count} time(s), first at step {step}: those readings were left out",
    "in_fit": "{label}: {note}",
    "call_did_not_return": "call {call}, {kind}() at {site}, did not return (it raised, or was interrupted)",
    "init_collective": "call {start} before making the callback",
    "no_collective": "leakdoctor has no collective for Keras's {backend} backend (jax and torch only)",
    "stop_warns_in_fits": "on_limit='stop' acts as 'warn', within fits as across calls: {variable} says this process "
                          "is one of several, but no collective is initialized for them to agree on a batch to stop "
                          "at, and a process that stopped alone would leave the others waiting in their next "
                          "collective; {fix}",
    "stop_warns_across_calls": "on_limit='stop' stops a fit (model.stop_training) but acts as 'warn' across calls: a "
                               "callback cannot end your loop of fit/evaluate/predict calls; to act on a leak across "
                               "calls, pass on_limit a function (it is given the summary) and end the loop there",
    "within_fit": "within {label} ({batches} batches; steps {first}-{last}, from its batch {batch}): {evidence}",
    "steps_are_batches": "steps are training batches ({calls:calls}, {batches:batches}), each call marked in "
                         "`calls`; the series hold one reading at the end of each call",
    "steps_are_calls": "steps are fit/evaluate/predict calls ({calls:calls}, {batches:batches}); the series hold one "
                       "reading at the end of each call",
    "no_holder": "{growth}; leakdoctor could not tell what holds it, so no finding was made",
    # ---- the generic rules (_judging/diagnosis.py)
    "cleanup_took_back": "{growth}; {rung} took it back, so an allocator was caching freed memory",
    "run_rung_periodically": "not a leak; if the cached memory is needed elsewhere, run {rung} periodically",
    "refilled": "not a leak, nothing to fix: {growth} as the program touched memory that malloc already held "
                "(pages a cleanup had given back to the system, or the free top of a thread's heap); nothing new "
                "was allocated: malloc's bytes in use and the mapped size stayed level",
    # ---- what a remedy did (remedies/*.py: its outcome's `detail`)
    "remedy_cap_cache": "mx.set_cache_limit({cap:bytes}), the largest transient working set (peak {peak:bytes} - "
                        "active {active:bytes}); previous limit {previous:bytes}",
    "remedy_clear_cache": "{clears:join} within 1% of step time",
    "remedy_clear_session": "keras.backend.clear_session() after each call that used a new model (global names restart)",
    "remedy_cond_to_where": "optimizer update rewritten: {sites} lax.cond -> select_n ({retraced})",
    "remedy_detach": "detached the tensors held by {holders:join}, and new ones after every step{appends}",
    "still_appends": "; {metric} still grows as the code appends, by detached items",
    "remedy_force_eval": "mx.eval({parts:join}) after every step",
    "remedy_gc_collect": "gc.collect() now, then young-generation collections within 1% of step time, at least every "
                         "{every} steps",
    "remedy_malloc_trim": "malloc_trim(0) within 1% of step time",
    "remedy_remove_hooks": "removed {removed} repeated hook(s) from {tables} hook table(s), then repeats after each step",
    "undone": "; undone",
    # ---- why a finding was withdrawn (reporting/report.py, callbacks/keras.py)
    "slow_over_run": "{metric} grew {rate:unit}/step over the run: too little to matter over {horizon} steps, "
                         "and nothing proves a leak",
    "flat_since_found": "{metric} did not grow over the run since it was found (its whole-run fit is flat or falling), "
                     "and nothing proves a leak",
    "stopped_after_remedy": "{metric} grew from step {first_step} ({cause}) and stopped after {remedy}, applied at step "
                            "{applied_step} for {other}",
    "stopped_by_itself": "{metric} grew from step {first_step} and stopped by itself after step {detected_step}",
    "grew_in_one_fit": "{metric} grew within fit() call {number} only: the {later} fits watched after it did not grow so",
    "unproven_and_slow": "not a leak yet: {growth}, survived cleanup, but nothing accounts for it and the low end of "
                         "its rate is too slow to matter over the horizon; watched on",
    "nothing_accounts": "{growth}, survived cleanup, and no Python allocation or framework counter accounts for it",
    "native_profiler": "look for native extensions or C libraries that allocate per step; run with "
                       "remedies='off' under a native profiler (memray --native, heaptrack)",
    "device_results_kept": "arrays on the device accumulate: look for results kept across steps",
}


#: How the rows of a census read, by the format spec that names them.
_ROWS = {
    "gained": "{type} +{gained}",
    "created": "{count} {type} (created at {site})",
    "tensors": "{count} × {tensors} ({size:bytes})",
    "counted": "{count} × {tensors}",
    "holders": "{holder} ({count})",
    "children": "{pid} ({steps} steps, {verdict})",
    "compiled": "{function} {count}x ({seconds:seconds})",
    "arrays": "+{count} {arrays} ({size:bytes})",
}


#: The nouns a count is said with, by the format spec that names them.
_NOUNS = {"calls": "call", "batches": "training batch"}


class _Formatter(string.Formatter):
    """str.format that renders nested records and reads numbers in units."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "unit":
            return format_value(value, self.params.get("unit", "count"))
        if format_spec in UNITS:
            return format_value(value, format_spec)
        if format_spec == "join":  # names, one after the other
            return ", ".join(str(v) for v in value)
        if format_spec in _NOUNS:  # a count and its noun: '1 call', '3 training batches'
            noun = _NOUNS[format_spec]
            return f"{value} {noun}" + ("" if value == 1 else "es" if noun.endswith("ch") else "s")
        if format_spec == "sizes":  # bytes, one after the other
            return ", ".join(format_value(v, "bytes") for v in value)
        if format_spec == "quoted":  # names of code, one after the other
            return ", ".join(f"`{v}`" for v in value)
        if format_spec in _ROWS:  # rows of a census, each a dict
            return ", ".join(_Formatter(row).vformat(_ROWS[format_spec], (), row) for row in value)
        if format_spec == "parts":  # records, each a part of a sentence
            return "; ".join(render(v) for v in value)
        if value is None:
            return ""
        if isinstance(value, dict) and "code" in value:
            return render(value)
        if isinstance(value, list) and all(isinstance(v, dict) and "code" in v for v in value):
            return "".join(render(v) for v in value)
        return super().format_field(value, format_spec)


def msg(code: str, **params: Any) -> Record:
    """A record of the catalogue's message `code` (an unknown code is a bug in the library: it raises)."""
    if code not in MESSAGES:
        raise KeyError(f"no message {code!r} in the catalogue")
    return {"code": code, "params": params}


def legacy(text: str | Record | list | None) -> Any:
    """A record for text of an old summary (prose kept as the `text` message), anything else as it is."""
    return {"code": "text", "params": {"text": text}} if isinstance(text, str) else text


def render(record: Record | list | str | None) -> str:
    """The text of a record (a list of records: one after the other; prose of an old file: as it is)."""
    if record is None:
        return ""
    if isinstance(record, str):
        return record
    if isinstance(record, list):
        return "".join(render(r) for r in record)
    params = record.get("params") or {}
    template = MESSAGES.get(record.get("code"))  # type: ignore[arg-type]
    if template is not None:
        try:
            return _Formatter(params).vformat(template, (), params)
        except (KeyError, IndexError, ValueError, TypeError):  # a newer file's params: said as they are
            pass
    return f"{record.get('code')}: {json.dumps(params, default=str)}"


def render_all(items: Iterable[Record | str]) -> list[str]:
    """The text of each record of a list (a summary's notes)."""
    return [render(item) for item in items]


def records(record: Any) -> Iterator[Record]:
    """The record and every record nested in its params, depth first (what a test or a program searches)."""
    if isinstance(record, list):
        for item in record:
            yield from records(item)
    elif isinstance(record, dict) and "code" in record:
        yield record
        for value in (record.get("params") or {}).values():
            yield from records(value)


def find(record: Any, code: str) -> Record | None:
    """The first record of that code in `record` or nested in it, or None."""
    return next((r for r in records(record) if r["code"] == code), None)


def codes(record: Any) -> list[str]:
    """The codes of the record and those nested in it."""
    return [r["code"] for r in records(record)]


def unique(items: Iterable[Record]) -> list[Record]:
    """The records once each, in order (a note said twice is said once)."""
    seen, kept = set(), []
    for item in items:
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


def location(file: str | None = None, line: int | None = None, function: str | None = None,
             holder: str | None = None) -> Location:
    """A location: the file and line, the function (without parentheses), the holder."""
    return {"file": file, "line": line, "function": function, "holder": holder}


_AT = re.compile(r"(?P<file>[^\s()]+\.[A-Za-z0-9]+):(?P<line>\d+)")
_HELD = re.compile(r"(?P<holder>.+?)(?: in (?P<function>[\w.<>]+)\(\))? \((?P<file>[^()]+):(?P<line>\d+)\)")
_SCOPED = re.compile(r"(?P<holder>.+?) in (?P<function>[\w.<>]+)\(\)")


def parse_location(text: str | dict | None) -> Location | None:
    """A location from the text the forensics name it by ('train.py:42', 'val_losses in train()
    (train.py:42)', 'RecordsDataset.records (data.py:12)', 'jax.live_arrays('cpu')'); what reads as none of
    these is a holder. `location_text` gives the same text back."""
    if text is None or isinstance(text, dict):
        return text
    for pattern in (_AT, _HELD, _SCOPED):
        found = pattern.fullmatch(text)
        if found:
            parts = found.groupdict()
            parsed = location(parts.get("file"), int(parts["line"]) if parts.get("line") else None,
                              parts.get("function"), parts.get("holder"))
            if location_text(parsed) == text:
                return parsed
    return location(holder=text)


def location_text(where: Location | str | None) -> str | None:
    """'val_losses in train() (train.py:42)', 'train.py:42', 'jax.live_arrays('cpu')': a location as a
    person reads it (the text of an old file as it is; None for none)."""
    if where is None or isinstance(where, str):
        return where
    at = f"{where['file']}:{where['line']}" if where.get("file") and where.get("line") is not None \
        else where.get("file")
    name = where.get("holder")
    if name and where.get("function"):
        name += f" in {where['function']}()"
    if name and at:
        return f"{name} ({at})"
    return name or at
