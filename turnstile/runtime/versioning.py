"""Worker Versioning: each worker runs as one Worker Deployment Version, and a
turn is Pinned to the version whose worker started it (the worker's default
versioning behaviour; declared on the worker, not on `AgentTurn`, because an
unversioned worker fails the tasks of a workflow that declares one when it
replays them). A turn in flight finishes on the build that
started it, whatever code is deployed meanwhile; new turns go to the
deployment's *current* version. That is how a change of workflow code never
breaks a turn in flight: no worker ever replays a history another build
recorded.

- Deployment name: TURNSTILE_DEPLOYMENT_NAME (default "turnstile").
- Build id: TURNSTILE_BUILD_ID (default `default_build_id()`: the package
  version, the turn's command-sequence version and revision, and a digest of
  the workflow code — turnstile.runtime.workflow_code —, so two builds whose
  workflow code differs are never one version).
- Which version is current is the operator's decision
  (`temporal worker deployment set-current-version`, or ramping). A worker
  makes its own version current only when TURNSTILE_MAKE_CURRENT says so:
  "first" (the default) when the deployment has no current version yet —
  a new cluster's first worker serves at once —, "always" (what `make up`
  does on the dev server), "never".
- TURNSTILE_WORKER_VERSIONING=off runs an unversioned worker, for servers
  without Worker Versioning; the upgrade check (turnstile.runtime.upgrade)
  then guards the turns in flight, as in v0.2.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from importlib import metadata

from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from turnstile.engine.contract import WORKFLOW_TYPE
from turnstile.engine.versions import TURN_REVISION, TURN_VERSION
from turnstile.runtime.config import Settings
from turnstile.runtime.workflow_code import workflow_digest

log = logging.getLogger(__name__)

# Temporal's search attribute naming the version a pinned workflow runs on.
VERSION_ATTRIBUTE = "TemporalWorkerDeploymentVersion"


def package_version() -> str:
    try:
        return metadata.version("turnstile")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0"


def default_build_id() -> str:
    """`<package version>-turn<version>.<revision>-<workflow code digest>`,
    e.g. 0.4.0-turn2.3-c6f6c9792a: it changes whenever the workflow code does
    (turnstile.runtime.workflow_code), whatever the version says."""
    return f"{package_version()}-turn{TURN_VERSION}.{TURN_REVISION}-{workflow_digest()}"


@dataclass(frozen=True)
class Deployment:
    name: str
    build_id: str

    @property
    def version(self) -> WorkerDeploymentVersion:
        return WorkerDeploymentVersion(deployment_name=self.name, build_id=self.build_id)

    @property
    def worker_config(self) -> WorkerDeploymentConfig:
        return WorkerDeploymentConfig(version=self.version, use_worker_versioning=True,
                                      default_versioning_behavior=VersioningBehavior.PINNED)

    @property
    def label(self) -> str:
        """The value of `TemporalWorkerDeploymentVersion` for this version."""
        return f"{self.name}:{self.build_id}"


def deployment_of(settings: Settings) -> Deployment | None:
    """The version this worker runs as (None: TURNSTILE_WORKER_VERSIONING=off)."""
    if not settings.worker_versioning:
        return None
    return Deployment(settings.deployment_name, settings.build_id or default_build_id())


async def current_build(client: Client, deployment_name: str) -> str | None:
    """The build id of the deployment's current version (None: none is, or the
    deployment does not exist yet)."""
    try:
        found = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace,
                                            deployment_name=deployment_name))
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    current = found.worker_deployment_info.routing_config.current_deployment_version
    return current.build_id or None


async def set_current(client: Client, deployment: Deployment, timeout: float = 30.0) -> None:
    """Make `deployment` current. Its worker must be polling: a version is known
    to the server only once one of its workers polled, so this retries until then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace, deployment_name=deployment.name,
                    build_id=deployment.build_id, identity="turnstile-worker"))
            return
        except RPCError as e:
            retryable = e.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION,
                                     RPCStatusCode.UNAVAILABLE, RPCStatusCode.ABORTED)
            if not retryable or loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def settle_current(client: Client, deployment: Deployment, make_current: str) -> str:
    """Apply TURNSTILE_MAKE_CURRENT once this version's worker polls; returns a
    sentence for the log."""
    current = await current_build(client, deployment.name)
    if current == deployment.build_id:
        return f"version {deployment.label} is current"
    if make_current == "always" or (make_current == "first" and current is None):
        await set_current(client, deployment)
        was = f" (was {current})" if current else ""
        return f"version {deployment.label} made current{was}"
    if current is None:
        return (f"version {deployment.label} serves no new turns: the deployment has no "
                f"current version; make it current with: temporal worker deployment "
                f"set-current-version --deployment-name {deployment.name} "
                f"--build-id {deployment.build_id}")
    return (f"version {deployment.label} runs beside current build {current}: it serves "
            f"the turns pinned to it; make it current with: temporal worker deployment "
            f"set-current-version --deployment-name {deployment.name} "
            f"--build-id {deployment.build_id}")


async def pinned_running(client: Client, deployment: Deployment) -> int:
    """Running turns pinned to this version (what draining waits for)."""
    query = (f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus = 'Running' AND "
             f"{VERSION_ATTRIBUTE} = '{deployment.label}'")
    return (await client.count_workflows(query)).count
