"""Keras bodies (shared feature extractors) and linear personal heads."""

from tff_pflego.models.bodies import BODIES, assign_weights, build_body
from tff_pflego.models.heads import (class_mask, head_logits, head_loss_and_accuracy,
                                     initial_head)

__all__ = ["BODIES", "assign_weights", "build_body", "class_mask", "head_logits",
           "head_loss_and_accuracy", "initial_head"]
