"""The names of a run directory's files. Free of TensorFlow: a run's settings are
checked against its directory (`experiment_config.resolve`) before TensorFlow loads."""

CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "round_"  # checkpoints/round_<n>/
CONFIG_FILE = "config.json"
PARTITION_FILE = "partition.json"
MACHINES_FILE = "machines.json"  # which machine made which rounds (`run_machines`)
METRICS_FILE = "metrics.csv"  # one row per all-client evaluation
ROUNDS_FILE = "rounds.csv"  # one row per round
CLIENTS_FILE = "clients.csv"  # one row per client: the final evaluation's
SUMMARY_FILE = "summary.json"  # written when the run finishes
CURVES_FILE = "curves.png"
TENSORBOARD_DIR = "tensorboard"
