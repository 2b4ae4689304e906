# Two commands do all set-up on a fresh machine: `make demo` (the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,example,bench]'
	touch $@

.PHONY: install demo test bench
install: $(VENV)/.installed

demo: install
	$(VENV)/bin/hermes run examples/digits/experiment.yaml

test: install
	-$(PY) -m compileall -q hermes examples tests bench  # bytecode written even under PYTHONDONTWRITEBYTECODE: the tests start thousands of Python processes (a file that does not compile is pytest's to report)
	$(PY) -m pytest -q -n 3 --dist loadfile -m 'not alone' --durations=15  # a file on one worker: its module fixtures once; three files at once, as its tests wait (sleeps, subprocesses) about 40% of the time on 2 cores
	$(PY) -m pytest -q -m alone  # timing-sensitive tests, with nothing beside them

bench: install
	$(PY) bench/paper_comparison.py
	$(PY) bench/scale.py
	$(PY) bench/report_rate.py
	$(PY) bench/live_view.py
	$(PY) bench/real_example.py --policies fifo,hermes,rr
	$(PY) bench/pool_workers.py
	$(PY) bench/best_curve.py
	$(PY) bench/switching.py
	$(PY) bench/frameworks/compare.py --rounds 2
	$(PY) bench/frameworks/compare.py --search tpe --trials 24 --epochs 20 \
		--systems fifo,hermes,optuna_median,ray_asha --ratio-to hermes
