"""Keras bodies (shared feature extractors) and linear personal heads."""

from tff_pflego.models.bodies import BODIES, build_body, feature_dim
from tff_pflego.models.heads import (build_head, head_logits, head_loss_and_accuracy,
                                     initial_head, class_mask)

__all__ = ["BODIES", "build_body", "build_head", "class_mask", "feature_dim",
           "head_logits", "head_loss_and_accuracy", "initial_head"]
