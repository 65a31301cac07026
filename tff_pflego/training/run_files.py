"""The names of a run directory's files. Free of TensorFlow: a run's settings are
checked against its directory (`experiment_config.resolve`) before TensorFlow loads."""

CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "round_"  # checkpoints/round_<n>/
CONFIG_FILE = "config.json"
PARTITION_FILE = "partition.json"
MACHINES_FILE = "machines.json"  # which machine made which rounds (`run_machines`)
