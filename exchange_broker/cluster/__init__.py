"""The cluster of broker nodes on one PostgreSQL store: membership, leases (node.py) and the
``exchange-broker cluster`` subcommand (status.py)."""
