"""A real OpenLDAP server for the LDAP backend's tests (tests/auth, tests/mqtt): Debian's slapd, started on free ports
with a throwaway configuration and database in a temp directory, filled with ldapadd, killed
and removed afterwards."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eb_support import free_port

sys.path.append(str(Path(__file__).resolve().parent / "security"))
from sec_helpers import make_pki  # noqa: E402  (the throwaway PKI of the TLS tests)

SLAPD = "/usr/sbin/slapd"
BASE = "dc=example,dc=com"
ROOT_DN, ROOT_PW = f"cn=admin,{BASE}", "secret"

DIRECTORY = f"""
dn: {BASE}
objectClass: dcObject
objectClass: organization
dc: example
o: Example

dn: ou=people,{BASE}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{BASE}
objectClass: organizationalUnit
ou: groups

dn: uid=alice,ou=people,{BASE}
objectClass: inetOrgPerson
uid: alice
cn: Alice
sn: A
description: team-orders
userPassword: alice-pw

dn: uid=bob,ou=people,{BASE}
objectClass: inetOrgPerson
uid: bob
cn: Bob
sn: B
userPassword: bob-pw

dn: uid=carol,ou=people,{BASE}
objectClass: inetOrgPerson
uid: carol
cn: Carol
sn: C
userPassword: carol-pw

dn: cn=admins,ou=groups,{BASE}
objectClass: groupOfNames
cn: admins
member: uid=alice,ou=people,{BASE}

dn: cn=staff,ou=groups,{BASE}
objectClass: groupOfNames
cn: staff
member: cn=admins,ou=groups,{BASE}
member: uid=bob,ou=people,{BASE}

dn: cn=vhost-prod,ou=groups,{BASE}
objectClass: groupOfNames
cn: vhost-prod
member: uid=bob,ou=people,{BASE}

dn: cn=monitors,ou=groups,{BASE}
objectClass: groupOfUniqueNames
cn: monitors
uniqueMember: uid=carol,ou=people,{BASE}
"""


class Slapd:
    """``with Slapd() as ldap:`` -> ``ldap.port`` (ldap://), ``ldap.tls_port`` (ldaps://),
    ``ldap.pki.ca`` (the CA of its certificate)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="eb-slapd-"))
        self.port, self.tls_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        self.pki = make_pki(self.dir / "pki")

    def _config(self) -> Path:
        (self.dir / "db").mkdir()
        conf = self.dir / "slapd.conf"
        conf.write_text(f"""
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {self.dir}/slapd.pid
TLSCACertificateFile {self.pki.ca}
TLSCertificateFile {self.pki.server_cert}
TLSCertificateKeyFile {self.pki.server_key}
database mdb
maxsize 16777216
suffix "{BASE}"
rootdn "{ROOT_DN}"
rootpw {ROOT_PW}
directory {self.dir}/db
access to attrs=userPassword by self read by anonymous auth by * none
access to * by * read
""")
        return conf

    def start(self) -> "Slapd":
        conf = self._config()
        urls = f"ldap://127.0.0.1:{self.port}/ ldaps://127.0.0.1:{self.tls_port}/"
        self.log = open(self.dir / "slapd.log", "wb")
        self.proc = subprocess.Popen([SLAPD, "-h", urls, "-f", str(conf), "-d", "0"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            done = subprocess.run(["ldapadd", "-x", "-H", f"ldap://127.0.0.1:{self.port}", "-D", ROOT_DN,
                                   "-w", ROOT_PW], input=DIRECTORY.encode(), capture_output=True)
            if done.returncode == 0:
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"slapd did not start: {done.stderr.decode()} "
                                   f"{(self.dir / 'slapd.log').read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    def ldap(self, *args: str) -> subprocess.CompletedProcess:
        """ldapmodify/ldapadd-style tools as the directory's admin."""
        return subprocess.run([*args, "-x", "-H", f"ldap://127.0.0.1:{self.port}", "-D", ROOT_DN,
                               "-w", ROOT_PW], capture_output=True)

    def pause(self) -> None:
        """The server hangs (accepts, never answers): SIGSTOP."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Slapd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# the LDAP backend's settings of the tests: user DNs, groups, and the JSON queries for vhost,
# resource and topic access and tags (the directory above answers them)
GROUPS = f"ou=groups,{BASE}"
QUERIES = {
    "auth_ldap_user_dn_pattern": f"uid=${{username}},ou=people,{BASE}",
    "auth_ldap_group_lookup_base": GROUPS,
    "auth_ldap_vhost_access_query": json.dumps(
        ["or", [["equals", "${vhost}", "/"], ["in_group", f"cn=vhost-${{vhost}},{GROUPS}"]]]),
    "auth_ldap_resource_access_query": json.dumps(
        ["for", [["permission", "configure", ["match", "${name}", "^${username}-"]],
                 ["permission", "write", ["or", [["match", "${name}", "^${username}-"],
                                                 ["equals", "${name}", "amq.topic"],
                                                 ["equals", "${name}", "amq.default"]]]],
                 ["permission", "read", ["constant", True]]]]),
    "auth_ldap_topic_access_query": json.dumps(
        ["for", [["permission", "write", ["match", "${routing_key}", "^${username}\\."]],
                 ["permission", "read", ["constant", True]]]]),
    "auth_ldap_tag_queries": json.dumps({
        "administrator": ["in_group", f"cn=admins,{GROUPS}"],
        "management": ["in_group_nested", f"cn=staff,{GROUPS}"],
        "monitoring": ["in_group", f"cn=monitors,{GROUPS}", "uniqueMember"],
        "policymaker": ["match", ["attribute", "${user_dn}", "description"], "^team-"]}),
}
