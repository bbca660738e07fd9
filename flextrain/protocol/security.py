"""A job's TLS material and per-job token, and the gRPC pieces that use them (docs/security.md).

Contract:

* :func:`make_credentials` makes one job's material: a self-signed CA of its own, one server certificate
  signed by it (used by the master and every parameter server of the job), and a random bearer token.
  The certificate names :data:`TARGET_NAME` (plus ``localhost``/``127.0.0.1``); clients verify the
  server against that name whatever address they dial (a Service's cluster IP, a pod IP, a DNS name),
  through gRPC's ``ssl_target_name_override`` — so one certificate serves every server of the job and
  no address has to be known when it is made.
* The files (:func:`write_credentials`, :func:`read_credentials`) are the keys of the job's Kubernetes
  Secret (``ca.crt``, ``tls.crt``, ``tls.key``, ``token``): a local job keeps them in ``<job dir>/tls/``,
  a pod has the Secret mounted as that directory. A client reads only ``ca.crt`` and ``token``; each file is
  checked (present, PEM) when read, and a problem names the file (:class:`CredentialsError`).
* Servers (:func:`add_port`, :func:`token_interceptor`) refuse every call without ``authorization:
  Bearer <the job's token>`` with UNAUTHENTICATED, and count each refusal. Clients
  (:func:`open_channel`) send the token with every call, over TLS when the job has a CA.

Everything that arrives is compared, never evaluated: the token with ``hmac.compare_digest``.
"""

from __future__ import annotations

import datetime
import hmac
import ipaddress
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from flextrain.durable import write_atomic

TARGET_NAME = "flextrain-job"  # the name every server certificate of a job carries; clients verify it
FILES = {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key", "token": "token"}  # also the Secret's keys
VALIDITY = datetime.timedelta(days=3650)  # a job's CA lives as long as the job's directory
AUTH_HEADER = "authorization"
ENV_DIR = "FLEXTRAIN_TLS_DIR"  # where a job's processes find its material (the job dir's tls/, or the Secret)


@dataclass(frozen=True)
class JobCredentials:
    """One job's TLS material (PEM bytes; ``ca`` empty: plaintext, token only) and bearer token."""

    token: str
    ca: bytes = b""
    cert: bytes = b""
    key: bytes = b""

    @property
    def tls(self) -> bool:
        return bool(self.ca)


def make_credentials(job_name: str, *, tls: bool = True) -> JobCredentials:
    """A new CA, a server certificate signed by it (module docstring) and a token; ``tls=False``: the token
    only."""
    token = secrets.token_urlsafe(32)
    if not tls:
        return JobCredentials(token=token)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"flextrain job {job_name} CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + VALIDITY)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(TARGET_NAME), x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TARGET_NAME)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return JobCredentials(
        token=token, ca=ca.public_bytes(pem), cert=cert.public_bytes(pem),
        key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def write_credentials(directory: Path, creds: JobCredentials) -> None:
    """The material as files (module docstring); the key and the token readable by the owner only."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    parts = {"token": creds.token.encode(), "ca": creds.ca, "cert": creds.cert, "key": creds.key}
    for part, data in parts.items():
        if data:
            path = directory / FILES[part]
            write_atomic(path, data)
            path.chmod(0o600 if part in ("key", "token") else 0o644)


class CredentialsError(ValueError):
    """A job's TLS material is missing or unusable; the message names the file (a user can fix it)."""


def _pem(path: Path, kind: str) -> bytes:
    """``path``'s bytes, checked to parse as ``kind`` ("certificate" or "private key") so that a broken file is
    named here rather than failing inside gRPC's C core ("Could not load any root certificate")."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    if not path.is_file():
        raise CredentialsError(f"{path} is missing: a job with TLS on needs its {kind}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        if kind == "private key":
            load_pem_private_key(data, password=None)
        else:
            x509.load_pem_x509_certificates(data)  # every certificate in the file, at least one
    except (ValueError, TypeError) as exc:  # the reason without cryptography's link to its FAQ
        reason = str(exc).split(". See ")[0].rstrip(".")
        raise CredentialsError(f"{path} is not a PEM {kind} ({reason})") from exc
    return data


def read_credentials(directory: Path, *, server: bool = False) -> JobCredentials:
    """The material in ``directory`` of a job with TLS on: its CA and token (all a client needs), plus the
    server certificate and key with ``server``. A file missing, empty or not PEM is a CredentialsError
    naming it.

    Whether a job runs with TLS is its own to say (``spec.tls``, status.json's ``tls``, FLEXTRAIN_TLS_DIR set
    by its master), never which files happen to exist: a TLS job whose CA is gone is an error here, not
    plaintext with the token, which would send the token in the clear. (Token-only credentials,
    ``make_credentials(tls=False)``, are never read from files.)"""
    token_file = directory / FILES["token"]
    if not token_file.is_file():
        raise CredentialsError(f"{token_file} is missing: a job with TLS on needs its token")
    try:
        token = token_file.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"cannot read {token_file}: {exc}") from exc
    if not token:
        raise CredentialsError(f"{token_file} is empty: the job's token is missing")
    ca = _pem(directory / FILES["ca"], "certificate")
    if not server:  # a client never loads the server's private key
        return JobCredentials(token=token, ca=ca)
    return JobCredentials(token=token, ca=ca, cert=_pem(directory / FILES["cert"], "certificate"),
                          key=_pem(directory / FILES["key"], "private key"))


def from_environment(*, server: bool) -> JobCredentials | None:
    """The job's material for a process its master started (``FLEXTRAIN_TLS_DIR``); None: none given.
    ``server``: with the server certificate and key (a parameter server, a Kubernetes master), else what a
    client needs (a worker). A problem is a CredentialsError naming the variable and the file."""
    import os

    directory = os.environ.get(ENV_DIR)
    if not directory:
        return None
    if not (Path(directory) / FILES["token"]).is_file():
        raise CredentialsError(f"{ENV_DIR}={directory} holds no token ({Path(directory) / FILES['token']})")
    try:
        return read_credentials(Path(directory), server=server)
    except CredentialsError as exc:
        raise CredentialsError(f"{ENV_DIR}={directory}: {exc}") from exc


# ---- servers ---------------------------------------------------------------------------------------
def add_port(server, address: str, creds: JobCredentials | None) -> int:
    """Bind ``address`` on a sync or asyncio gRPC server: TLS with the job's certificate when it has one."""
    if creds is not None and creds.tls:
        return server.add_secure_port(address, grpc.ssl_server_credentials([(creds.key, creds.cert)]))
    return server.add_insecure_port(address)


def _authorized(metadata, token: str) -> bool:
    expected = f"Bearer {token}".encode()
    for key, value in metadata or ():
        if key == AUTH_HEADER:
            given = value.encode() if isinstance(value, str) else value
            return hmac.compare_digest(given, expected)
    return False


def _refuse(handler, message: str, *, aio: bool = False):
    """A handler of ``handler``'s kind that refuses the call with UNAUTHENTICATED (``aio``: for an asyncio
    server, whose ``context.abort`` is a coroutine)."""
    if aio:
        async def unary(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        stream = unary
    else:
        def unary(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        stream = unary

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(stream)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(unary)
    return grpc.unary_unary_rpc_method_handler(unary)


MESSAGE = "this job's token is required (authorization: Bearer <token>; docs/security.md)"


class TokenInterceptor(grpc.ServerInterceptor):
    """A sync server's check: calls without the job's token are refused (``on_refused(method)`` counts)."""

    def __init__(self, token: str, *, on_refused: Callable[[str], None] = lambda method: None) -> None:
        self.token, self.on_refused = token, on_refused

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or _authorized(handler_call_details.invocation_metadata, self.token):
            return handler
        self.on_refused(handler_call_details.method)
        return _refuse(handler, MESSAGE)


class AioTokenInterceptor(grpc.aio.ServerInterceptor):
    """The same check for an asyncio server (the master's)."""

    def __init__(self, token: str, *, on_refused: Callable[[str], None] = lambda method: None) -> None:
        self.token, self.on_refused = token, on_refused

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or _authorized(handler_call_details.invocation_metadata, self.token):
            return handler
        self.on_refused(handler_call_details.method)
        return _refuse(handler, MESSAGE, aio=True)


# ---- clients ---------------------------------------------------------------------------------------
class _TokenClient(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the job's token to every call of a channel."""

    def __init__(self, token: str) -> None:
        self.header = (AUTH_HEADER, f"Bearer {token}")

    def _details(self, details):
        # grpc hands interceptors its call details as a namedtuple
        return details._replace(metadata=[*(details.metadata or ()), self.header])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def open_channel(address: str, creds: JobCredentials | None, *, options: Sequence[tuple] = ()) -> grpc.Channel:
    """A channel to one of the job's servers: TLS verified against the job's CA when it has one, the token on
    every call when there is one, plaintext otherwise."""
    if creds is None:
        return grpc.insecure_channel(address, options=list(options))
    if creds.tls:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=creds.ca),
                                      options=[*options, ("grpc.ssl_target_name_override", TARGET_NAME)])
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    return grpc.intercept_channel(channel, _TokenClient(creds.token))


__all__ = ["AUTH_HEADER", "AioTokenInterceptor", "CredentialsError", "ENV_DIR", "FILES", "JobCredentials",
           "TARGET_NAME", "TokenInterceptor", "add_port", "from_environment", "make_credentials", "open_channel",
           "read_credentials", "write_credentials"]
