"""The named options of the algorithms' settings, free of TensorFlow so that the
binaries check their flags (`tff_pflego.settings`) before it loads."""

# PFLEGO's final head step (`pflego.make_client_update`): exact (rho/q alpha_i, the
# spec's eq. 5) or the reference code's (rho/q, eq. 3).
HEAD_STEPS = ("exact", "paper_code")
# PFLEGO's head-only steps (`pflego.head_gradient_steps`): gradient descent, or
# descent that keeps the head and halves the rate when a step would raise the loss.
HEAD_OPTIMIZERS = ("gd", "monotone_gd")
# The server optimizers (`server_optimizers.build_server_optimizer`) and their
# learning-rate schedules.
SERVER_OPTIMIZERS = ("adam", "sgd")
SERVER_LR_SCHEDULES = ("constant", "cosine")
