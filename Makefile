# tff-pflego. Every target sets itself up first (tools/setup.sh is idempotent).
PY := .venv/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup setup-bazel run test bazel-build bazel-test benchmark benchmark-cost benchmark-memory benchmark-population profile-round benchmark-round-transfer benchmark-body-pass reproduce crosscheck reproduce-unified

setup:
	@bash tools/setup.sh

## The main job: PFLEGO, real Fashion-MNIST, High-Pers, the paper's hyperparameters.
run: setup
	$(PY) binaries/train.py --dataset=fashion_mnist --personalization=high \
	    --eval_every=10 --output_dir=runs/fashion_mnist_high --overwrite

## The whole test suite: test files spread over TEST_WORKERS processes (pytest-xdist),
## each with its own TFF worker; TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest tests -q --durations=10 -n $(TEST_WORKERS) --dist=loadfile

setup-bazel:
	@bash tools/setup.sh --bazel

bazel-build: setup-bazel
	bazel build //...

bazel-test: setup-bazel
	bazel test //...

benchmark: setup
	$(PY) binaries/benchmark_pflego.py --output_dir=runs/benchmark

## Client cost per round, PFLEGO vs FedAvg vs FedPer, the same clients (MLP and Conv4).
benchmark-cost: setup
	$(PY) binaries/benchmark_cost.py --output_dir=runs/benchmark_cost

## Memory over 1000 rounds, PFLEGO and FedAvg (~45 min on 2 cores).
benchmark-memory: setup
	$(PY) binaries/benchmark_memory.py --algorithms=pflego,fedavg --rounds=1000 \
	    --output_dir=runs/benchmark_memory

## I = 10,000 clients (EMNIST-Letters): training round vs I = 100, all-client evaluation.
benchmark-population: setup
	$(PY) binaries/benchmark_population.py --output_dir=runs/benchmark_population

## Where a round's wall time goes (PFLEGO and FedAvg, Fashion-MNIST High-Pers).
profile-round: setup
	$(PY) binaries/profile_round.py --output_dir=runs/profile_round

## What moving a round's values driver <-> worker costs: PFLEGO's round in three forms.
benchmark-round-transfer: setup
	$(PY) binaries/benchmark_round_transfer.py --rounds=90 \
	    --output_dir=runs/benchmark_round_transfer

## One body pass per client on this machine: the unit a round's seconds are counted in
## (machines differ ~3x on Conv4); RUNS= run directories made here, set beside it.
benchmark-body-pass: setup
	$(PY) binaries/benchmark_body_pass.py --output_dir=runs/benchmark_body_pass \
	    $(if $(RUNS),--runs=$(RUNS))

## The paper's Tables 1-2 on the five datasets (issue #14): cells never run first, then
## the cells run before records existed (their rows are in docs/results.csv, their
## curves are not); tens of hours on 2 cores. Resumable across machines: finished cells
## are kept as records under docs/runs and skipped, a cell stopped mid-way is parked
## there and continued. Several `make reproduce` at once share the grid (claims).
REPRODUCE := $(PY) binaries/reproduce.py --output_dir=runs/reproduce --docs_dir=docs
## An invocation that fails (a cell failed; reproduce.py ran the rest of its cells) lets
## the next one run and fails the recipe at its end; a stop (Ctrl-C, SIGTERM: exit
## 128 + signal) stops the grid.
GO_ON = || { status=$$?; [ $$status -lt 128 ] || exit $$status; failed=1; }
reproduce: setup
	@failed=0; \
	$(REPRODUCE) --datasets=cifar10 --algorithms=pflego $(GO_ON); \
	$(REPRODUCE) --datasets=omniglot --algorithms=pflego --eval_every=20 $(GO_ON); \
	$(REPRODUCE) --datasets=emnist_letters --algorithms=fedrecon,fedper,fedavg $(GO_ON); \
	$(REPRODUCE) --datasets=fashion_mnist --degrees=medium,none \
	    --algorithms=fedrecon,ditto,fedrep,fedprox,fedbabu $(GO_ON); \
	$(REPRODUCE) --datasets=mnist --degrees=medium,none \
	    --algorithms=fedrecon,ditto,fedper,fedavg,fedprox,fedrep,fedbabu $(GO_ON); \
	$(REPRODUCE) --datasets=mnist --degrees=high --algorithms=fedprox,fedrep,fedbabu $(GO_ON); \
	$(REPRODUCE) --datasets=cifar10 --degrees=high --algorithms=fedrecon \
	    --cache_head_features $(GO_ON); \
	$(REPRODUCE) --datasets=omniglot --algorithms=fedrecon --eval_every=20 \
	    --cache_head_features $(GO_ON); \
	$(REPRODUCE) --datasets=fashion_mnist --degrees=high --algorithms=ditto \
	    --seeds=1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=fashion_mnist --degrees=none --algorithms=fedavg \
	    --seeds=1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=omniglot --rounds=100 --eval_every=20 --cache_head_features \
	    --algorithms=fedbabu,fedrep,fedper,fedprox,fedavg,ditto $(GO_ON); \
	$(REPRODUCE) --datasets=cifar10 --degrees=high --rounds=50 --cache_head_features \
	    --algorithms=fedavg,fedper,fedprox,fedrep,fedbabu,ditto $(GO_ON); \
	$(REPRODUCE) --datasets=fashion_mnist --degrees=medium,none --algorithms=pflego \
	    --seeds=1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=mnist --degrees=high --algorithms=fedrecon --seeds=1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=mnist --degrees=medium --algorithms=fedrecon --seeds=1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=mnist --degrees=none --algorithms=fedavg --seeds=1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=fashion_mnist --degrees=high --algorithms=pflego \
	    --seeds=1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=emnist_letters --algorithms=pflego $(GO_ON); \
	$(REPRODUCE) --datasets=fashion_mnist \
	    --algorithms=pflego,fedavg,fedper,fedprox,fedrep,fedbabu,ditto,fedrecon,local_only \
	    $(GO_ON); \
	$(REPRODUCE) --datasets=mnist --algorithms=pflego --seeds=0,1,2,3,4 $(GO_ON); \
	$(REPRODUCE) --datasets=mnist --degrees=high --algorithms=fedrecon,ditto,fedper,fedavg $(GO_ON); \
	exit $$failed

## PFLEGO's accuracy outside TFF (plain TF, same seed) and two central references.
crosscheck: setup
	$(PY) binaries/crosscheck_accuracy.py --tff_run=runs/fashion_mnist_high \
	    --output_dir=runs/crosscheck

## The unified framework: synthetic MX2 / EWS with every optimizer (~40 min), the
## real-data grid (5 datasets x c = 2, 4, 8 x MT2 / MX2 / APFL2 x LSGD / ASCD / ASVRCD,
## 135 runs, ~4-5 h on 2 cores) and the ablations; resumable, runs already made are read.
reproduce-unified: setup
	$(PY) binaries/reproduce_unified.py --output_dir=runs/unified --docs_dir=docs/unified
	$(PY) binaries/reproduce_unified.py --datasets=synthetic_mx2 --heterogeneity=0.3 \
	    --algorithms=ascd_pfl,asvrcd_pfl,l2sgd_plus --repetitions=30 \
	    --output_dir=runs/unified --docs_dir=docs/unified
	$(PY) binaries/reproduce_unified.py --datasets=synthetic_mx2 --heterogeneity=0.3 \
	    --algorithms=lsgd_pfl,scd_pfl,ascd_pfl --devices_per_round=5,10 \
	    --output_dir=runs/unified --docs_dir=docs/unified
	$(PY) binaries/reproduce_unified.py \
	    --datasets=mnist,fashion_mnist,emnist_letters,cifar10,cifar10_colour --classes=2,4,8 \
	    --algorithms=lsgd_pfl,ascd_pfl,asvrcd_pfl --output_dir=runs/unified --docs_dir=docs/unified
	$(PY) binaries/reproduce_unified.py --datasets=cifar10 --objectives=apfl2 --classes=4,8 \
	    --algorithms=ascd_pfl --p_w=0.1,0.3 --output_dir=runs/unified --docs_dir=docs/unified
	$(PY) binaries/reproduce_unified.py --datasets=mnist --classes=2 --objectives=mt2 \
	    --algorithms=ascd_pfl --mt_alpha=0.1,0.3,3,10,100 --output_dir=runs/unified \
	    --docs_dir=docs/unified
	$(PY) binaries/reproduce_unified.py --datasets=mnist --classes=2 --objectives=mx2 \
	    --algorithms=ascd_pfl --p_w=0.1,0.3,0.5,0.7,0.9 --no_reparametrize \
	    --output_dir=runs/unified --docs_dir=docs/unified
	$(PY) binaries/reproduce_unified.py --datasets=mnist --classes=2 --objectives=mt2,apfl2 \
	    --algorithms=ascd_pfl --no_reparametrize --output_dir=runs/unified --docs_dir=docs/unified
