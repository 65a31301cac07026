"""pFedMe (Dinh et al. 2020; spec UNIFIED.md section 3), the MX baseline as the
reference runs it: per communication every device starts from the server's w, then R
times draws a minibatch D (b draws with replacement, duplicates removed), takes K
gradient steps of size `inner_lr` on f~_D(theta) + (lam/2)|theta - w_m|^2 from its
last theta (warm start), and moves w_m <- w_m - eta lam (w_m - theta); the server
averages the w_m. The personal models are the theta_m; w is not rescaled, so the
reported iterate is (w / s, beta_m = theta_m) on MX2 (11).
Settings (the reference's): R = 20, K = 5, inner_lr = 1, b = 20, eta = 0.005.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_pflego.errors import UserError
from tff_pflego.unified import sampling
from tff_pflego.unified.objectives import DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig, UnifiedAlgorithm, compose

LOCAL_ROUNDS, INNER_STEPS, INNER_LR, BATCH, ETA = 20, 5, 1.0, 20, 0.005


def build(objective: Objective, data: DeviceData, config: OptimizerConfig
          ) -> UnifiedAlgorithm:
  if objective.kind != "mx2":
    raise UserError(f"pfedme solves the mixture objective: use --objective=mx2, "
                    f"not {objective.kind}")
  n, d, lam, s = data.num_examples, objective.local_dim, objective.penalty, objective.scale
  seed = config.seed

  def client(broadcast, examples, state):
    schedule, device = broadcast["schedule"], state["device"]
    w = s * broadcast["w"]["y"]
    draws = tf.reshape(sampling.example_indices(
        seed, schedule["round"], device, LOCAL_ROUNDS * BATCH, n), [LOCAL_ROUNDS, BATCH])

    def local_round(r, w_m, theta, evaluated):
      batch, _ = tf.unique(draws[r])
      x, y = tf.gather(examples["x"], batch), tf.gather(examples["y"], batch)

      def inner(k, theta):
        grad = objective.loss_gradient(theta, x, y) + lam * (theta - w_m)
        return k + 1, theta - INNER_LR * grad

      _, theta = tf.while_loop(lambda k, _: k < INNER_STEPS, inner, (0, theta))
      return (r + 1, w_m - ETA * lam * (w_m - theta), theta,
              evaluated + INNER_STEPS * tf.size(batch))

    _, w_m, theta, evaluated = tf.while_loop(
        lambda r, *_: r < LOCAL_ROUNDS, local_round, (0, w, state["beta"]["y"], 0))
    counts = collections.OrderedDict(w_gradients=tf.constant(0), beta_gradients=evaluated)
    return (collections.OrderedDict(model=w_m),
            collections.OrderedDict(device=device, beta=collections.OrderedDict(y=theta)),
            counts)

  def server(w_state, schedule, mean_update):
    del w_state, schedule
    return collections.OrderedDict(y=mean_update["model"] / s)

  def schedule(round_num):
    del round_num
    return dict(local_steps=tf.constant(LOCAL_ROUNDS))

  zeros = collections.OrderedDict(y=np.zeros(d))
  return compose("pfedme", objective, zeros, zeros, schedule, client, server, data)
