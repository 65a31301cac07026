"""The central ceiling's head-only warm-up epoch against a float64 numpy reference:
the body stays at its initialization and the heads follow Adam on L(psi)'s minibatch
estimate over the initial body's features, minibatch for minibatch."""

import numpy as np

from tff_pflego.data import sources
from tff_pflego.models import build_body
from tff_pflego.training import ceiling


class _Data:
  """Three clients of random Fashion-MNIST-shaped images, K_i = 2, 3, 4."""

  def __init__(self):
    rng = np.random.default_rng(5)
    self.spec = sources.get_dataset_spec("fashion_mnist")
    self.num_classes = np.array([2, 3, 4])
    self.num_clients = 3
    sizes = {"train": (150, 60, 90), "test": (10, 10, 10)}
    self._arrays = {
        part: [(rng.random((n,) + self.spec.image_shape).astype(np.float32),
                rng.integers(0, k, n).astype(np.int32))
               for n, k in zip(sizes[part], self.num_classes)] for part in sizes}

  def client_arrays(self, index, part="train"):
    return self._arrays[part][index]


def _adam_reference(features, labels, ids, sizes, seed):
  """One epoch of Keras-Adam on the heads alone, float64, in the ceiling's order."""
  n, m = features.shape
  k = int(sizes.max())
  params = [np.zeros((len(sizes), m, k)), np.zeros((len(sizes), k))]
  moments = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
  b1, b2, eps, lr = 0.9, 0.999, 1e-7, ceiling.LEARNING_RATE
  order = np.random.default_rng(seed).permutation(n)
  for t, start in enumerate(range(0, n, ceiling.BATCH_SIZE), 1):
    batch = order[start:start + ceiling.BATCH_SIZE]
    f, y, i = features[batch], labels[batch], ids[batch]
    logits = np.einsum("nm,nmk->nk", f, params[0][i]) + params[1][i]
    logits = np.where(np.arange(k)[None] < sizes[i][:, None], logits, -1e9)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    g_logits = p / len(y)
    grads = [np.zeros_like(params[0]), np.zeros_like(params[1])]
    np.add.at(grads[0], i, f[:, :, None] * g_logits[:, None, :])
    np.add.at(grads[1], i, g_logits)
    alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
    for param, grad, (m1, m2) in zip(params, grads, moments):
      m1 += (grad - m1) * (1 - b1)
      m2 += (grad**2 - m2) * (1 - b2)
      param -= alpha * m1 / (np.sqrt(m2) + eps)
  return params


def test_the_warm_up_fits_the_heads_alone_with_adam_on_the_initial_features():
  data = _Data()
  fit = ceiling.fit_central(data, seed=3, epochs=0, progress=False)
  initial = build_body(data.spec.body, data.spec.image_shape, 3)
  for got, want in zip(fit.body.get_weights(), initial.get_weights()):
    np.testing.assert_array_equal(got, want)  # the body did not move
  x, y, ids = ceiling.pooled(data, "train")
  features = initial(x).numpy().astype(np.float64)
  heads, biases = _adam_reference(features, y, ids, data.num_classes, seed=3)
  assert np.abs(heads).max() > 1e-3  # the heads moved: 3 Adam steps of ~1e-3
  # Adam's step is ~1e-3 whatever the gradient's size, so where a gradient changes sign
  # float32 rounding moves it by up to ~1e-6: 0.5 % of a step is the tolerance.
  np.testing.assert_allclose(fit.heads.numpy(), heads, rtol=0, atol=5e-6)
  np.testing.assert_allclose(fit.biases.numpy(), biases, rtol=0, atol=5e-6)
