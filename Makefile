# Trainyard. The two commands: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
NODES ?= 1
PYTEST_ARGS ?=

.PHONY: run test lint bench venv clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

run: venv
	$(PY) manage.py studio up --port $(PORT) --nodes $(NODES)

# Without REDIS_URL the suite runs against an embedded Redis started for it; without
# DATABASE_URL, against SQLite (CI sets both: PostgreSQL and the machine's Redis).
# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE): the
# suite starts hundreds of Django processes (nodes, Celery, studios, CLIs), each of which
# would otherwise compile every module of the project again (~0.5 s each here).
test: venv
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m studio.embedded_redis -- $(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy studio datasets jobs hosting review evaluations trainyard algorithms tuning overview trainyard_site

bench: venv
	$(PY) bench/datasets.py
	$(PY) bench/serving.py
	$(PY) bench/metrics.py
	$(PY) bench/training.py
	$(PY) bench/hosting.py
	$(PY) bench/evaluation.py
	$(PY) bench/parallel.py
	$(PY) bench/review.py  # PostgreSQL only: says how to point it at one otherwise

clean:
	rm -rf $(VENV) var
