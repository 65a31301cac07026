"""L2SGD+ (Hanzely & Richtarik 2020, Alg. 2; spec UNIFIED.md section 3), the MX
baseline: SAGA-style local steps and probabilistic averaging on the mixture objective

    (1/M) sum_m f~_m(x_m) + (lam / 2M) sum_m |x_m - xbar|^2          (9),

which is MX2 (11) minimized over w (w / sqrt(M) = xbar), so it shares MX2's F*.
Each iteration, with probability p (ASVRCD's p_w; its eta too):
  averaging (a communication):
    g_m = (lam / (M p)) (x_m - xbar) - (1/p - 1) Psi_m / M + Jbar_m / M,
    x_m <- x_m - eta g_m,  Psi_m <- lam (x_m - xbar) at the new x_m (as the reference;
    either point keeps the estimate unbiased);
  otherwise a local step on one example j:
    g_m = (grad f~_{m,j}(x_m) - J_{m,j}) / (M (1 - p)) + Jbar_m / M + Psi_m / M,
    x_m <- x_m - eta g_m,  J_{m,j} <- grad f~_{m,j}(x_m before the step),
with J the SAGA table (zero at the start) and Jbar_m its mean over j. A TFF round is
K ~ Geometric(p) - 1 local steps, then the devices send x_m and the server averages;
the averaging step itself runs at the start of the next round, when xbar arrives
(nothing changes x_m in between). The reported iterate is (w = xbar / s, beta_m = x_m).
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_pflego.errors import UserError
from tff_pflego.unified import sampling
from tff_pflego.unified.objectives import DTYPE, DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig, UnifiedAlgorithm, compose


def build(objective: Objective, data: DeviceData, config: OptimizerConfig
          ) -> UnifiedAlgorithm:
  if objective.kind != "mx2":
    raise UserError(f"l2sgd_plus solves the mixture objective: use --objective=mx2, "
                    f"not {objective.kind}")
  m, n, d = objective.num_devices, data.num_examples, objective.local_dim
  p, eta, lam, s = config.params.p_w, config.params.eta, objective.penalty, objective.scale
  seed = config.seed

  def client(broadcast, examples, state):
    schedule, device = broadcast["schedule"], state["device"]
    st = state["beta"]
    x_bar = s * broadcast["w"]["y"]
    x, table, table_mean, psi = st["y"], st["table"], st["table_mean"], st["psi"]
    # The previous round's averaging step (round 0 has none).
    g = (lam / (m * p)) * (x - x_bar) - (1 / p - 1) * psi / m + table_mean / m
    averaged = x - eta * g
    first = tf.equal(schedule["round"], 0)
    x = tf.where(first, x, averaged)
    psi = tf.where(first, psi, lam * (averaged - x_bar))
    local = schedule["local_steps"]
    index = sampling.example_indices(seed, schedule["round"], device, local, n)

    def step(k, x, table, table_mean):
      j = index[k]
      grad = objective.loss_gradient(x, examples["x"][j:j + 1], examples["y"][j:j + 1])
      old = table[j]
      g = (grad - old) / (m * (1 - p)) + table_mean / m + psi / m
      table = tf.tensor_scatter_nd_update(table, [[j]], grad[tf.newaxis])
      return k + 1, x - eta * g, table, table_mean + (grad - old) / n

    _, x, table, table_mean = tf.while_loop(lambda k, *_: k < local, step,
                                            (tf.constant(0), x, table, table_mean))
    new = collections.OrderedDict(y=x, table=table, table_mean=table_mean, psi=psi)
    counts = collections.OrderedDict(w_gradients=tf.constant(0), beta_gradients=local)
    return (collections.OrderedDict(model=x),
            collections.OrderedDict(device=device, beta=new), counts)

  def server(w_state, schedule, mean_update):
    del w_state, schedule
    return collections.OrderedDict(y=mean_update["model"] / s)

  def schedule(round_num):
    return sampling.round_schedule(seed, round_num, p, 0.0, False)

  beta_initial = collections.OrderedDict(
      y=np.zeros(d), table=np.zeros((n, d)), table_mean=np.zeros(d), psi=np.zeros(d))
  return compose("l2sgd_plus", objective, collections.OrderedDict(y=np.zeros(d)),
                 beta_initial, schedule, client, server, data)
