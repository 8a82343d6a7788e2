"""Amazon SageMaker backend: `ml.*` instance types, on boto3.

Credentials and region come from boto3's standard chain (environment, ~/.aws, instance role),
or from the `boto_session` argument; endpoints follow boto3's own settings (e.g.
``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_SAGEMAKER``). `submit()` does what the SageMaker
Python SDK v2 does for the same estimator arguments: local checks first (no request before
they pass), then the default bucket (``sagemaker-<region>-<account>``, created if missing, with
the expected-owner check), the deterministic ``sourcedir.tar.gz`` upload to
``s3://<bucket>/<job>/source/sourcedir.tar.gz``, and CreateTrainingJob.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from meshtrain.backends import BackendUnreachable
from meshtrain.backends.sagemaker import model_trainer
from meshtrain.backends.sagemaker.checks import (
    ROLE_ARN,
    check_training_job,
    parse_s3_uri,
    resolve_image_uri,
)
from meshtrain.backends.sagemaker.job import SageMakerTrainingJob
from meshtrain.backends.sagemaker.options import SageMakerOptions, build_options
from meshtrain.backends.sagemaker.request import (
    RequestContext,
    build_training_request,
    code_uri_for,
    default_output_path,
)
from meshtrain.backends.sagemaker.shipping import (
    requirements_with_runtime,
    ships_runtime,
    stage_runtime,
)
from meshtrain.backends.sagemaker.spec import spec_from_description
from meshtrain.contract.archive import write_sourcedir_tarball
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.targets import target_of

if TYPE_CHECKING:
    from meshtrain.targets import Target

logger = logging.getLogger(__name__)
LOGS_CLIENT_CONFIG = Config(retries={"max_attempts": 15, "mode": "standard"})  # as the SDK
LOOKUP_CLIENT_CONFIG = Config(connect_timeout=5, read_timeout=15,
                              retries={"max_attempts": 2, "mode": "standard"})


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class SageMakerBackend:
    """Runs JobSpecs as SageMaker training jobs. Creating it makes no AWS request."""

    name = "sagemaker"

    def __init__(self, target: Target | None = None, **options: Any) -> None:
        self.target = target
        self.options: SageMakerOptions = build_options(**options)
        self._session = self.options.boto_session
        self._clients: dict[str, Any] = {}
        self._account: str | None = None

    @property
    def session(self) -> Any:
        """The boto3 session: `boto_session`, else boto3's standard chain."""
        if self._session is None:
            self._session = boto3.Session()
        return self._session

    @property
    def region(self) -> str | None:
        """The session's region (None when nothing configures one)."""
        return self.session.region_name

    def client(self, service: str) -> Any:
        """A boto3 client of the session (endpoints from boto3's own configuration)."""
        if service not in self._clients:
            config = LOGS_CLIENT_CONFIG if service == "logs" else None
            self._clients[service] = self.session.client(service, config=config)
        return self._clients[service]

    def account_id(self) -> str:
        """The caller's account (STS GetCallerIdentity, asked once)."""
        if self._account is None:
            self._account = self.client("sts").get_caller_identity()["Account"]
        return self._account

    # --- the Backend protocol -------------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        """Everything SageMaker would reject, checked locally: raises ConfigError, no AWS call."""
        check_training_job(spec, target_of(spec.instance_type, self.target), self.options,
                           self.region)

    def submit(self, spec: JobSpec) -> SageMakerTrainingJob:
        """Validate, stage the code in S3 and call CreateTrainingJob; return the job's handle."""
        self.validate(spec)
        spec = spec.model_copy(update={"region": self.region})
        if spec.model_trainer is not None:
            return self._submit_model_trainer(spec)
        context = self.resolve_context(spec)
        if not spec.source_dir.startswith("s3://"):
            self.upload_source(spec, context)
        request = build_training_request(spec, self.options, context)
        logger.info("Creating training job %s", spec.job_name)
        self.client("sagemaker").create_training_job(**request)
        return self.handle(spec.job_name)

    def _submit_model_trainer(self, spec: JobSpec) -> SageMakerTrainingJob:
        """SDK v3's staging and request (backends/sagemaker/model_trainer.py)."""
        bucket = self.ensure_default_bucket()
        output_path = spec.output_path or model_trainer.default_output_path(spec, bucket)
        context = RequestContext(
            region=str(spec.region), role_arn=self.expand_role(str(spec.role)),
            image_uri=resolve_image_uri(spec, target_of(spec.instance_type, self.target),
                                        spec.region),
            output_path=output_path, code_uri="")
        staging = model_trainer.Staging(self, spec, context.role_arn, bucket, output_path)
        channels = model_trainer.stage_channels(spec, staging)
        request = model_trainer.build_request(spec, context, channels, bucket)
        logger.info("Creating training job %s", spec.job_name)
        self.client("sagemaker").create_training_job(**request)
        return self.handle(spec.job_name)

    def attach(self, job_name: str) -> SageMakerTrainingJob:
        """The handle of an existing training job (ConfigError if there is none)."""
        self._describe(job_name)
        return self.handle(job_name)

    def load_spec(self, job_name: str) -> JobSpec:
        """The JobSpec of an existing job, rebuilt from DescribeTrainingJob."""
        return spec_from_description(self._describe(job_name), self.region)

    # --- the job registry -------------------------------------------------------------------

    def find(self, job_name: str) -> SageMakerTrainingJob | None:
        """The handle of the training job `job_name`, None if SageMaker has none;
        BackendUnreachable without a region or credentials, or when AWS cannot be reached."""
        try:
            self._describe(job_name, client=self._lookup_client())
        except ConfigError:
            return None
        return self.handle(job_name)

    def job_names(self) -> list[str]:
        """The most recent training jobs' names (one ListTrainingJobs page)."""
        try:
            response = self._lookup_client().list_training_jobs(
                SortBy="CreationTime", SortOrder="Descending", MaxResults=100)
        except (BotoCoreError, ClientError) as error:
            raise BackendUnreachable(f"AWS could not be reached: {error}") from None
        return [job["TrainingJobName"] for job in response.get("TrainingJobSummaries", [])]

    def summaries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The most recent training jobs, newest first (one ListTrainingJobs page); an ended
        job's FailureReason, which the page lacks, comes from DescribeTrainingJob."""
        client = self._lookup_client()
        try:
            response = client.list_training_jobs(SortBy="CreationTime", SortOrder="Descending",
                                                 MaxResults=min(limit or 100, 100))
        except (BotoCoreError, ClientError) as error:
            raise BackendUnreachable(f"AWS could not be reached: {error}") from None
        rows = sorted(response.get("TrainingJobSummaries", []),  # not every endpoint sorts
                      key=lambda job: job["CreationTime"].timestamp(), reverse=True)
        for row in rows:
            if row["TrainingJobStatus"] in ("Failed", "Stopped"):
                row.update({key: value for key, value in self._describe(
                    row["TrainingJobName"], client=client).items()
                    if key in ("FailureReason", "SecondaryStatus", "StoppingCondition")})
        return rows[:limit]

    def not_found(self, job_name: str) -> str:
        return f"no SageMaker training job named {job_name!r} in {self.region}"

    def _lookup_client(self) -> Any:
        """A SageMaker client that gives up quickly (a lookup must not hang on a dead network);
        BackendUnreachable when nothing configures a region or credentials."""
        if not self.region or self.session.get_credentials() is None:
            raise BackendUnreachable("no AWS region or credentials: pass --region / configure "
                                     "AWS")
        return self.session.client("sagemaker", config=LOOKUP_CLIENT_CONFIG)

    # --- steps ------------------------------------------------------------------------------

    def handle(self, job_name: str) -> SageMakerTrainingJob:
        """The TrainingJob handle of `job_name` (no request)."""
        return SageMakerTrainingJob(
            job_name, self.client("sagemaker"), self.client("logs"),
            poll_seconds=self.options.poll_seconds,
            describe_seconds=self.options.describe_seconds)

    def _describe(self, job_name: str, client: Any = None) -> dict[str, Any]:
        try:
            description = (client or self.client("sagemaker")).describe_training_job(
                TrainingJobName=job_name)
        except ClientError as error:
            if _error_code(error) in ("ValidationException", "ResourceNotFound"):
                raise ConfigError(f"no SageMaker training job named {job_name!r} in "
                                  f"{self.region}: {error}") from None
            if client is None:
                raise
            raise BackendUnreachable(f"AWS refused the lookup: {error}") from None
        except BotoCoreError as error:
            if client is None:
                raise
            raise BackendUnreachable(f"AWS could not be reached: {error}") from None
        description.pop("ResponseMetadata", None)
        return description

    def resolve_context(self, spec: JobSpec) -> RequestContext:
        """Role ARN, image, output path and code location, asking AWS only what it must."""
        region = str(spec.region)
        # Without output_path, output and code go to the default bucket (SDK); otherwise to
        # output_path's bucket or code_location, and the default bucket is never touched.
        bucket = self.ensure_default_bucket() if spec.output_path is None else ""
        output_path = spec.output_path or default_output_path(bucket)
        image = resolve_image_uri(spec, target_of(spec.instance_type, self.target), region)
        code_uri = code_uri_for(spec, self.options, bucket)
        derived = bool(bucket) and self.options.default_bucket is None
        owner = self.account_id() if derived and code_uri.startswith(f"s3://{bucket}/") else None
        return RequestContext(region=region, role_arn=self.expand_role(str(spec.role)),
                              image_uri=image, output_path=output_path, code_uri=code_uri,
                              code_bucket_owner=owner)

    def expand_role(self, role: str) -> str:
        """A role ARN as is; a role name through IAM GetRole (as the SDK's expand_role)."""
        if ROLE_ARN.match(role):
            return role
        try:
            return self.client("iam").get_role(RoleName=role)["Role"]["Arn"]
        except ClientError as error:
            raise ConfigError(f"role={role!r}: IAM has no such role ({error}). Pass the role's "
                              "ARN.") from None

    def ensure_default_bucket(self) -> str:
        """The default bucket, created if missing; ``sagemaker-<region>-<account>`` must be
        owned by this account (ExpectedBucketOwner), so that nobody else's bucket of that name
        receives the code and the model."""
        derived = self.options.default_bucket is None
        bucket = self.options.default_bucket or f"sagemaker-{self.region}-{self.account_id()}"
        owner = {"ExpectedBucketOwner": self.account_id()} if derived else {}
        s3 = self.client("s3")
        try:
            s3.head_bucket(Bucket=bucket, **owner)
            return bucket
        except ClientError as error:
            code = _error_code(error)
            if code in ("403", "AccessDenied", "Forbidden"):
                raise ConfigError(
                    f"S3 bucket {bucket!r} exists but the expected-owner check for account "
                    f"{self.account_id()} failed (another account owns it, or this role may "
                    "not list it). Pass output_path='s3://<your bucket>/...' or "
                    "default_bucket=...") from None
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise
        location = {} if self.region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": self.region}}
        try:
            s3.create_bucket(Bucket=bucket, **location)
            logger.info("Created S3 bucket %s", bucket)
        except ClientError as error:  # created meanwhile by another client of this account
            if _error_code(error) != "BucketAlreadyOwnedByYou":
                raise
        return bucket

    def upload_source(self, spec: JobSpec, context: RequestContext) -> list[str]:
        """Pack source_dir (or the lone entry script) and dependencies; put it at code_uri."""
        bucket, key = parse_s3_uri(context.code_uri, "code location")
        extra: dict[str, Any] = {"ServerSideEncryption": "aws:kms"}  # SDK default at rest
        output_bucket = parse_s3_uri(context.output_path, "output_path")[0]
        if self.options.output_kms_key and bucket == output_bucket:
            extra["SSEKMSKeyId"] = self.options.output_kms_key
        if context.code_bucket_owner:
            extra["ExpectedBucketOwner"] = context.code_bucket_owner
        with tempfile.TemporaryDirectory(prefix="meshtrain-source-") as scratch:
            tarball = Path(scratch) / "sourcedir.tar.gz"
            dependencies, replace = [Path(d) for d in spec.dependencies], {}
            if ships_runtime(spec, context.image_uri):
                dependencies += stage_runtime(Path(scratch) / "runtime")
                replace = requirements_with_runtime(spec)
            members = write_sourcedir_tarball(Path(spec.source_dir), tarball, dependencies,
                                              replace)
            self.client("s3").put_object(Bucket=bucket, Key=key, Body=tarball.read_bytes(),
                                         **extra)
        return members
