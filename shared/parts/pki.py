"""The dev cluster's certificates: one CA, the API server's serving certificate, client certificates
for the admin and each control-plane component, and the service-account signing key.

As kubeadm lays them out, in one directory: ``ca.crt``/``ca.key``, ``<name>.crt``/``<name>.key`` and
``sa.key``/``sa.pub``. A client certificate's CN is the user and its O the groups, which is how the
API server's RBAC authorizer sees it (``system:masters`` for the admin, ``system:kube-controller-manager``
for the controller manager, and so on).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = dt.timedelta(days=365)


def _write_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common: str, groups: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
                     + [x509.NameAttribute(NameOID.COMMON_NAME, common)])


class Authority:
    """The cluster's CA, made once in ``root`` and read back afterwards."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        crt, key = root / "ca.crt", root / "ca.key"
        if crt.exists() and key.exists():
            self.cert = x509.load_pem_x509_certificate(crt.read_bytes())
            loaded = serialization.load_pem_private_key(key.read_bytes(), None)
            assert isinstance(loaded, ec.EllipticCurvePrivateKey)
            self.key = loaded
            return
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(_name("muster-devcluster-ca"))
                     .issuer_name(_name("muster-devcluster-ca")).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + VALID)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        crt.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.key, key)

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    def issue(self, name: str, common: str, *, groups: tuple[str, ...] = (), hosts: tuple[str, ...] = (),
              server: bool = False) -> tuple[Path, Path]:
        """A certificate and key signed by the CA (a client's, or with ``server`` a serving one for
        ``hosts``); ``(crt, key)`` paths. Made once: an existing pair is returned as it is."""
        crt, key_path = self.root / f"{name}.crt", self.root / f"{name}.key"
        if crt.exists() and key_path.exists():
            return crt, key_path
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(_name(common, groups)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + VALID)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if hosts:
            sans: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        crt.write_bytes(builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return crt, key_path

    def service_account_keys(self) -> tuple[Path, Path]:
        """The key pair the API server signs service-account tokens with: ``(sa.key, sa.pub)``."""
        private, public = self.root / "sa.key", self.root / "sa.pub"
        if not (private.exists() and public.exists()):
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            _write_key(key, private)
            public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo))
        return private, public
