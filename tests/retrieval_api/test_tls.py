"""The Retrieve server over TLS, and over mutual TLS where the client certificate's common name
decides the tenant (no token). Certificates come from a throwaway CA made in the test."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.settings import SorSettings, StoreSettings
from ragdev.services.postgres import PostgresCluster
from retrieval_api.app import build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from tests.retrieval_api.stack import Stack
from tests.streams.support import entities_plan

pytestmark = pytest.mark.integration


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate `acme-service`."""

    def __init__(self, directory: Path) -> None:
        ca_key = _key()
        self.ca = _cert("ragstream test CA", ca_key, None, ca_key, ca=True)
        server_key, client_key = _key(), _key()
        server = _cert("localhost", server_key, self.ca.subject, ca_key, server=True)
        client = _cert("acme-service", client_key, self.ca.subject, ca_key)
        self.files: dict[str, x509.Certificate | ec.EllipticCurvePrivateKey] = {
            "ca": self.ca,
            "server": server,
            "server_key": server_key,
            "client": client,
            "client_key": client_key,
        }
        for name, obj in self.files.items():
            (directory / f"{name}.pem").write_bytes(_pem(obj))
        self.dir = directory

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.pem"

    def pem(self, name: str) -> bytes:
        return self.path(name).read_bytes()


@pytest.fixture
def served(
    postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> Iterator[tuple[Pki, int]]:
    # index one document with the plaintext stack, then serve the same store over mTLS too
    stack = Stack(postgres.dsn, tmp_path / "store", embedder)
    stack.write(
        "ent-tls", "acme", "Certificates are rotated every ninety days by the platform team."
    )
    table = stack.table
    stack.channel.close()
    asyncio.run_coroutine_threadsafe(stack.app.server.stop(), stack._loop).result(30)
    pki = Pki(tmp_path)
    settings = RetrieveSettings(
        grpc=GrpcSettings(
            port=0,
            tls_cert_file=pki.path("server"),
            tls_key_file=pki.path("server_key"),
            tls_client_ca_file=pki.path("ca"),
        ),
        auth=AuthSettings(mtls_tenants={"acme-service": "acme"}),
        store=StoreSettings(data_dir=tmp_path / "store"),
        sor=SorSettings(kind="postgres", dsn=SecretStr(postgres.dsn)),
        plan=entities_plan(f"public.{table}"),
        publish_enabled=False,
    )
    app = build_app(settings, CollectorRegistry(), store=stack.store, embedder=embedder)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(30)
    try:
        yield pki, app.server.port
    finally:
        asyncio.run_coroutine_threadsafe(app.server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        app.close()
        stack.close()


def test_mtls_client_certificate_maps_to_its_tenant_and_plaintext_is_refused(
    served: tuple[Pki, int],
) -> None:
    pki, port = served
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.pem("ca"),
        private_key=pki.pem("client_key"),
        certificate_chain=pki.pem("client"),
    )
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        stub = pb_grpc.RetrievalServiceStub(channel)
        pack = stub.Retrieve(
            pb.RetrieveRequest(query_text="how often are certificates rotated?"), timeout=30
        )
        assert pack.tenant == "acme"
        assert [r.entity_id for r in pack.results] == ["entities:ent-tls"]
        with pytest.raises(grpc.RpcError) as err:  # the certificate's tenant is acme
            stub.Retrieve(pb.RetrieveRequest(query_text="rotation", tenant="globex"), timeout=30)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

    no_client_cert = grpc.ssl_channel_credentials(root_certificates=pki.pem("ca"))
    with grpc.secure_channel(f"127.0.0.1:{port}", no_client_cert) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.RetrievalServiceStub(channel).Retrieve(
                pb.RetrieveRequest(query_text="rotation"), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # handshake refused

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.RetrievalServiceStub(channel).Retrieve(
                pb.RetrieveRequest(query_text="rotation"), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
