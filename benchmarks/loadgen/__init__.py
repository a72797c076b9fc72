"""The benchmarks' shared parts: a lean raw-frame AMQP client (``wire``, ``client``,
``publisher``), amqp_load's scenarios and --verify, brokers under test and /proc readings
(``brokers``, ``procs``), and the same-run comparison tables (``report``)."""
