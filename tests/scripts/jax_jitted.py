"""A JAX training loop whose step is jitted, in one of three spellings (run by tests/test_run_compiled.py
under `leakdoctor run`, unedited): `python jax_jitted.py {jit|eqx|nnx} STEPS`.

- jit: `@jax.jit` train_step with the optax update inside, an eval_step jitted too (called before
  training and at the end), and a one-off `jax.jit(lambda x: x + 1)(x)` warm-up line;
- eqx: an equinox MLP, `@eqx.filter_jit` train step (optax inside), evaluated every 50 steps from the
  first on by a filter_jit loss over the batches (equinox's MNIST example: the loss is called a second
  time before the train step is);
- nnx: a flax.nnx MLP, `@nnx.jit` train step (nnx.Optimizer.update inside).
"""

import sys

import jax
import jax.numpy as jnp
import optax

kind = sys.argv[1] if len(sys.argv) > 1 else "jit"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 150
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (256, 16))
y = jnp.sum(x[:, :4], axis=1, keepdims=True)
batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
tx = optax.adam(1e-2)

if kind == "jit":
    params = {"w": jnp.zeros((16, 1)), "b": jnp.zeros((1,))}
    opt_state = tx.init(params)

    def loss_fn(p, xb, yb):
        return jnp.mean((xb @ p["w"] + p["b"] - yb) ** 2)

    @jax.jit
    def train_step(p, s, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    @jax.jit
    def eval_step(p):
        return loss_fn(p, x, y)

    jax.jit(lambda v: v + 1)(x)  # a one-off warm-up jit
    print(f"initial loss {float(eval_step(params)):.3f}")
    for i in range(steps):
        params, opt_state, loss = train_step(params, opt_state, *batches[i % len(batches)])
    print(f"final loss {float(eval_step(params)):.3f}")

elif kind == "eqx":
    import equinox as eqx

    model = eqx.nn.MLP(16, 1, 32, 2, key=key)
    opt_state = tx.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def train_step(m, s, xb, yb):
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(xb) - yb) ** 2))(m)
        updates, s = tx.update(grads, s, eqx.filter(m, eqx.is_array))
        return eqx.apply_updates(m, updates), s, loss

    @eqx.filter_jit
    def batch_loss(m, xb, yb):
        return jnp.mean((jax.vmap(m)(xb) - yb) ** 2)

    def evaluate(m):  # as equinox's MNIST example: a jitted loss over the test batches, not itself jitted
        return sum(float(batch_loss(m, xb, yb)) for xb, yb in batches) / len(batches)

    for i in range(steps):
        model, opt_state, loss = train_step(model, opt_state, *batches[i % len(batches)])
        if i % 50 == 0:  # from the first step on: the evaluation's loss is called 8 times before step 2
            evaluate(model)

elif kind == "nnx":
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(16, 32, rngs=rngs)
            self.out = nnx.Linear(32, 1, rngs=rngs)

        def __call__(self, v):
            return self.out(nnx.relu(self.hidden(v)))

    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def train_step(m, opt, xb, yb):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(xb) - yb) ** 2))(m)
        opt.update(m, grads)
        return loss

    for i in range(steps):
        loss = train_step(model, optimizer, *batches[i % len(batches)])

print(f"trained {steps} steps")
