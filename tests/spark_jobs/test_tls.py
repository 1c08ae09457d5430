"""score.py reaching a daemon exposed on TCP with TLS and a bearer token: a real daemon started
with --host, --tls-cert, --tls-key and --token-file, and a real local Spark job."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from tritonclient.utils import InferenceServerException

from service.local_daemon import DaemonProcess, free_port
from spark_jobs.score import parse_args, score, write
from tests.support.daemon import MODELS, self_signed
from tests.support.served import reply_devices
from tools.mnist_digits import write_parquet


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory) -> tuple[str, Path, Path]:
    """The daemon's TCP address, the CA (its own self-signed certificate) and the token file."""
    tmp = tmp_path_factory.mktemp("tls")
    self_signed(tmp / "cert.pem", tmp / "key.pem")
    (tmp / "token").write_text("spark-token-0123\n")
    port = free_port()
    daemon = DaemonProcess(
        ["--models", str(MODELS), "--host", "127.0.0.1", "--port", str(port),
         "--socket", str(tmp / "grpc.sock"), "--metrics-port", "0",
         "--tls-cert", str(tmp / "cert.pem"), "--tls-key", str(tmp / "key.pem"),
         "--token-file", str(tmp / "token")], f"unix:{tmp / 'grpc.sock'}", tmp / "daemon.log")
    daemon.wait_ready()
    yield f"127.0.0.1:{port}", tmp / "cert.pem", tmp / "token"
    assert daemon.stop() == 0


def _job(spark, tmp_path: Path, source: Path, address: str, *credentials: str) -> pd.DataFrame:
    args = parse_args(["--input", str(source), "--output", str(tmp_path / "scored.parquet"),
                       "--daemon", address, "--no-start-daemon", *credentials])
    write(spark, score(spark, args), args)
    return pd.read_parquet(args.output)


def test_a_job_scores_through_a_daemon_reached_with_tls_and_a_token(spark, tls_daemon, holdout,
                                                                     tmp_path):
    address, ca, token = tls_daemon
    images, labels = holdout[0][:400], holdout[1][:400]
    source = write_parquet(tmp_path / "digits.parquet", images, labels)
    scored = _job(spark, tmp_path, source, address, "--tls-ca", str(ca),
                  "--token-file", str(token)).sort_values("id")
    assert scored["id"].tolist() == list(range(400))
    assert (scored["label"].to_numpy() == labels).mean() >= 0.95
    assert set(scored["device"]) <= set(reply_devices())


def test_without_the_token_the_job_fails_naming_the_missing_credentials(spark, tls_daemon,
                                                                        holdout, tmp_path):
    address, ca, _ = tls_daemon
    source = write_parquet(tmp_path / "digits.parquet", holdout[0][:10], holdout[1][:10])
    with pytest.raises(InferenceServerException, match="authorization") as refused:
        _job(spark, tmp_path, source, address, "--tls-ca", str(ca))
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    assert [p.name for p in tmp_path.iterdir()] == ["digits.parquet"]  # no output at all
