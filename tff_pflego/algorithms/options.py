"""The named options of the algorithms' settings, free of TensorFlow so that the
binaries check their flags (`tff_pflego.settings`) before it loads."""

# PFLEGO's head step (`pflego.make_client_update`): the exact gradient of the
# client's loss, or the reference code's.
HEAD_STEPS = ("exact", "paper_code")
# PFLEGO's head-only steps (`pflego.head_gradient_steps`): gradient descent, or
# descent that keeps the head and halves the rate when a step would raise the loss.
HEAD_OPTIMIZERS = ("gd", "monotone_gd")
# The server optimizers (`server_optimizers.build_server_optimizer`) and their
# learning-rate schedules.
SERVER_OPTIMIZERS = ("adam", "sgd")
SERVER_LR_SCHEDULES = ("constant", "cosine")
