# Cluster maintenance (docs/cluster.md). Every target is a thin call to a Python command
# (`marin cluster ...` or infra/configure_gcp_registry.py) where the logic lives and is tested.
#
#   make -n TARGET              print the commands a target runs
#   make TARGET DRY_RUN=1       run them with --dry-run: print the exact gcloud/docker command lines
#   make TARGET CLUSTER=NAME    the cluster for the token targets (default us-central2)
#   make TARGET PROJECT=P       the GCP project of cluster_docker and configure_gcp_registry_all

# Regions that get the cluster image and the registry cleanup policy (one Artifact Registry
# repository each). Narrow it to push one region: make cluster_docker CLUSTER_REPOS=us-west4
CLUSTER_REPOS ?= us-central2 us-west4 europe-west4 us-east5 us-east1 us-central1
default_registry_name ?= marin
# The GCP project of the registries (the cluster table's, marin.cluster.config.DEFAULT_PROJECT).
PROJECT ?= hai-gcp-models
REGION_ARGS = $(foreach region,$(CLUSTER_REPOS),--region $(region))
CLUSTER ?= us-central2
STAGING_CLUSTER := us-central2-staging

UV ?= uv
MARIN ?= $(UV) run marin
PYTHON ?= $(UV) run python
DRY := $(if $(DRY_RUN),--dry-run,)

# Refuse clearly (before doing anything) when the first word of $(MARIN) is not installed.
MARIN_TOOL := $(firstword $(MARIN))
need_marin = @command -v $(MARIN_TOOL) >/dev/null 2>&1 || { \
	echo "make: '$(MARIN_TOOL)' not found: install uv (https://docs.astral.sh/uv/) and run 'uv sync'" >&2; exit 127; }

.PHONY: help dev_setup get_ray_auth_token get_ray_auth_token_staging init_ray_auth_token_secret \
	cluster_docker configure_gcp_registry_all clean_preempted_tpus

help:
	@echo "make dev_setup                    uv sync, the cluster ssh key and the default Ray token"
	@echo "make get_ray_auth_token           install the Ray token of CLUSTER (default us-central2) in ~/.ray"
	@echo "make get_ray_auth_token_staging   install the staging cluster's token"
	@echo "make init_ray_auth_token_secret   create CLUSTER's token secret once (refuses to overwrite)"
	@echo "make cluster_docker               build the cluster image, push it to CLUSTER_REPOS, record its tag (all regions only)"
	@echo "make configure_gcp_registry_all   set the registry cleanup policy in every CLUSTER_REPOS region"
	@echo "make clean_preempted_tpus         list CLUSTER's PREEMPTED/TERMINATED TPU VMs (add YES=1 to delete them)"
	@echo "Add DRY_RUN=1 to print the gcloud/docker command lines instead of running them;"
	@echo "ALLOW_DIRTY=1 lets cluster_docker build uncommitted changes (tags get -dirty)."

dev_setup:
	$(need_marin)
	$(if $(DRY_RUN),@echo "$(UV) sync",$(UV) sync)
	$(MARIN) cluster $(DRY) install-ssh-key
	$(MARIN) cluster --cluster $(CLUSTER) $(DRY) auth

get_ray_auth_token:
	$(need_marin)
	$(MARIN) cluster --cluster $(CLUSTER) $(DRY) auth

get_ray_auth_token_staging:
	$(need_marin)
	$(MARIN) cluster --cluster $(STAGING_CLUSTER) $(DRY) auth

init_ray_auth_token_secret:
	$(need_marin)
	$(MARIN) cluster --cluster $(CLUSTER) $(DRY) init-auth-secret

cluster_docker:
	$(need_marin)
	$(MARIN) cluster $(DRY) build-image --project $(PROJECT) $(if $(ALLOW_DIRTY),--allow-dirty,) $(REGION_ARGS)

configure_gcp_registry_all:
	$(need_marin)
	$(foreach region,$(CLUSTER_REPOS),$(PYTHON) infra/configure_gcp_registry.py $(default_registry_name) \
		--region=$(region) --project=$(PROJECT) $(DRY) &&) true

clean_preempted_tpus:
	$(need_marin)
	$(MARIN) cluster --cluster $(CLUSTER) $(DRY) clean-preempted-tpus $(if $(YES),--yes,)
