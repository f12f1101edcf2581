"""The testbed's certificates: a certificate authority made at bring-up, a certificate per daemon (server and client:
daemons call each other) and one per client role, for the control plane's mutual TLS (docs/architecture.md,
"Security").

A certificate's identity is its subject's common name: `daemon:NODE`, `viewer`, `operator` or `rank:JOB`; the
daemons map it to a role (testbed/live/src/authz.cpp) and the role to the RPCs it may call (the `roles` option of
each rpc in control.proto). A folder holds:

    ca.pem                 the CA's certificate: what every daemon and client trusts
    ca.key                 its key (only bring-up signs; never handed to a daemon or container)
    NODE.pem, NODE.key     each daemon's certificate (its management address and name as subject alternative names)
    viewer.pem/.key, operator.pem/.key, rank.pem/.key   the client roles' (rank: of job 1 unless told)

Keys are EC P-256, private files mode 0600. Python's `cryptography` (Debian's python3-cryptography) writes them.
"""
import datetime
import ipaddress
import os
import pathlib
import re

from . import _args

ROLES = ("viewer", "operator", "rank")
DEFAULT_DAYS = 30
MAX_DAYS = 36500  # a certificate's validity: 1 day (0 made one expired at birth) to a hundred years
# A DNS name in a certificate: RFC 1123 labels (letters, digits, '-' inside), and '_', which node names may carry
# (the topology loader and containers.check_node_names take it; Docker's DNS and OpenSSL's host check match it).
# No wildcard: a SAN here names one daemon.
_DNS_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_DNS_NAME_MAX = 253


class PkiError(ValueError):
    pass


def _x509():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as e:  # pragma: no cover - the project's setup installs it
        raise PkiError(f"certificates need python3-cryptography ({e}); run ./ifec setup")
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def identity(role, qualifier=None):
    """The common name a certificate of `role` carries: daemon:NODE, rank:JOB, viewer, operator."""
    if role not in ROLES + ("daemon",):
        raise PkiError(f"role {role!r}: expected one of {', '.join(ROLES + ('daemon',))}")
    if role in ("daemon", "rank") and qualifier in (None, ""):
        raise PkiError(f"a {role} certificate names its {'node' if role == 'daemon' else 'job'}")
    return f"{role}:{qualifier}" if role in ("daemon", "rank") else role


def _file_name(name):
    """A certificate's file name in its folder: one plain name (a node named '../x' wrote its key beside the folder)."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\0"):
        raise PkiError(f"certificate file name {name!r}: expected one plain name, no '/', '..' or NUL")
    return name


def _subject_names(addresses):
    """`addresses` as ipaddress objects (IP SANs) and host names (DNS SANs); PkiError naming the first that is
    neither (a space, an empty label, a '*' or a mistyped IP address such as 10.0.0.256 went in as a DNS name)."""
    out = []
    for a in _args.items(addresses, "addresses"):  # one string is one address, not a list of its characters
        try:
            out.append(ipaddress.ip_address(a))
            continue
        except ValueError:
            pass
        labels = a.split(".")
        if (not 0 < len(a) <= _DNS_NAME_MAX or not all(_DNS_LABEL.fullmatch(label) for label in labels)
                or all(label.isdigit() for label in labels)):
            raise PkiError(f"address {a!r}: expected an IP address or a DNS host name (labels of 1 to 63 letters, "
                           f"digits, '-' or '_', not starting or ending with '-', at most {_DNS_NAME_MAX} in all)")
        out.append(a)
    return out


def _write(path, data, private=False):
    path = pathlib.Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600 if private else 0o644)  # an existing file keeps its mode through O_CREAT
    return path


def _key_pem(key):
    _, _, serialization, *_ = _x509()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert):
    _, _, serialization, *_ = _x509()
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(folder, name="ifec testbed CA", days=DEFAULT_DAYS):
    """A new CA in `folder` (ca.pem, ca.key); returns the certificate's path."""
    x509, hashes, _, ec, _, NameOID = _x509()
    days = _args.whole(days, "days", 1, MAX_DAYS)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} {os.urandom(4).hex()}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(folder / "ca.key", _key_pem(key), private=True)
    return _write(folder / "ca.pem", _cert_pem(cert))


def _load_ca(folder):
    x509, _, serialization, *_ = _x509()
    folder = pathlib.Path(folder)
    try:
        cert = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError) as e:
        raise PkiError(f"{folder}: no usable CA (ca.pem and ca.key): {e}")
    return cert, key


def issue(folder, file_name, common_name, addresses=(), days=DEFAULT_DAYS, valid_from=None, ca_folder=None):
    """A certificate signed by the CA in `ca_folder` (default `folder`), written as folder/FILE_NAME.pem and .key;
    `addresses` (IP addresses or DNS names) make it a server's too. valid_from: its start (default now); a start
    more than `days` ago gives an expired certificate (what the tests present). Returns (cert, key) paths."""
    x509, hashes, _, ec, EKU, NameOID = _x509()
    file_name, days = _file_name(file_name), _args.whole(days, "days", 1, MAX_DAYS)
    names = _subject_names(addresses)
    folder = pathlib.Path(folder)
    ca_cert, ca_key = _load_ca(ca_folder or folder)
    key = ec.generate_private_key(ec.SECP256R1())
    start = valid_from or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    sans = [x509.DNSName(n) if isinstance(n, str) else x509.IPAddress(n) for n in names]
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
         .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([EKU.CLIENT_AUTH] + ([EKU.SERVER_AUTH] if sans else [])),
                        critical=False))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    return (_write(folder / f"{file_name}.pem", _cert_pem(cert)),
            _write(folder / f"{file_name}.key", _key_pem(key), private=True))


def make(folder, daemons, job=1, days=DEFAULT_DAYS, progress=None):
    """A testbed's certificates in `folder` (made afresh): the CA, each daemon's (`daemons`: node name -> its
    addresses, the name itself added) and the client roles'. Returns the folder."""
    if not hasattr(daemons, "items"):
        raise TypeError(f"daemons={daemons!r}: expected a dict of node name -> its addresses")
    sans = {}
    for name, addresses in daemons.items():
        _file_name(name)  # every name, address (and the days) checked before the folder's certificates are removed
        sans[name] = [*_args.items(addresses, f"daemons[{name!r}]"), name]
        _subject_names(sans[name])
    _args.whole(days, "days", 1, MAX_DAYS)
    folder = pathlib.Path(folder)
    for old in folder.glob("*.pem"):
        old.unlink()
    make_ca(folder, days=days)
    for name, addresses in sans.items():
        issue(folder, name, identity("daemon", name), addresses, days)
    for role in ROLES:
        issue(folder, role, identity(role, job if role == "rank" else None), (), days)
    if progress:
        progress(f"tls: a new CA and {len(daemons)} daemon and {len(ROLES)} client certificates in {folder}")
    return folder


def client_files(folder, role):
    """(ca.pem, ROLE.pem, ROLE.key) of a client role in `folder`, checked present."""
    folder = pathlib.Path(folder)
    files = (folder / "ca.pem", folder / f"{role}.pem", folder / f"{role}.key")
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise PkiError(f"no {role} certificate: {', '.join(missing)} missing (the bring-up makes them)")
    return files


def grpc_credentials(folder, role):
    """gRPC channel credentials presenting `role`'s certificate and trusting the folder's CA."""
    import grpc
    ca, cert, key = client_files(folder, role)
    return grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes(), cert.read_bytes())
