"""Logins per second: open and close N pika connections (PLAIN, the internal backend) against this
broker (started on a free port, temp data dir) and the RabbitMQ on 127.0.0.1:5672, in the same run.
Usage: python benchmarks/login_rate.py. OAuth 2.0 and LDAP logins are not measured here."""
import sys, time, pika, subprocess, tempfile, os
def rate(port, n=200):
    p = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"))
    t = time.perf_counter()
    for _ in range(n):
        pika.BlockingConnection(p).close()
    return n / (time.perf_counter() - t)
d = tempfile.mkdtemp(prefix="eb-login-bench-")
pf = os.path.join(d, "port")
proc = subprocess.Popen([sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1", "--port", "0",
                         "--port-file", pf, "--admin-port", "0", "--data-dir", d], stderr=subprocess.DEVNULL)
while not os.path.exists(pf) or not open(pf).read().strip(): time.sleep(0.1)
ours_port = int(open(pf).read())
time.sleep(0.5)
for run in range(2):
    o, r = rate(ours_port), rate(5672)
    print(f"run {run+1}: exchange-broker {o:.0f} logins/s, RabbitMQ {r:.0f} logins/s, ratio {o/r:.2f}")
proc.terminate(); proc.wait()
import shutil; shutil.rmtree(d, ignore_errors=True)
