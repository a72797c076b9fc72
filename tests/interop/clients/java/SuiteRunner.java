// Runs test classes of the RabbitMQ Java client's own suite (JUnit 4) against whatever broker
// answers on localhost at ConnectionFactory's default AMQP port, which the suite hard-codes.
// test_java_client_suite.py runs our broker and this runner inside a network namespace of their
// own (`unshare -n`), so the machine's RabbitMQ is never reached nor its port bound there. It
// leaves out the tests that drive the broker's host rather than the
// protocol: they call rabbitmqctl or make (close a connection from the server side, restart the
// node, change user tags), which neither this broker nor a remote RabbitMQ offers to a client.
// Prints "PASS name" / "FAIL name: first line of the failure" per test and "SUMMARY run failed".
// A failed test whose method is named in the RETRY_ONCE environment variable (comma-separated:
// tests whose assertions rest on the suite's own sleeps) runs once more, alone, after its class:
// "RETRY name", then its PASS or FAIL line again; the last line for a name is its outcome.
// Usage: java SuiteRunner com.rabbitmq.client.test.functional.Routing ...
import java.util.Arrays;
import java.util.HashSet;
import java.util.Set;
import org.junit.runner.Description;
import org.junit.runner.JUnitCore;
import org.junit.runner.Request;
import org.junit.runner.Result;
import org.junit.runner.manipulation.Filter;
import org.junit.runner.notification.Failure;
import org.junit.runner.notification.RunListener;

public class SuiteRunner {
    static final Set<String> NEEDS_HOST_TOOLS = new HashSet<>(Arrays.asList(
        "restartingExpiry",        // TTLHandling: make stop-rabbit-on-node start-rabbit-on-node
        "impersonatedUserId"));    // UserIDHeader: rabbitmqctl set_user_tags

    public static void main(String[] args) throws Exception {
        JUnitCore core = new JUnitCore();
        core.addListener(new RunListener() {
            Set<String> failed = new HashSet<>();
            @Override public void testFailure(Failure f) {
                failed.add(f.getDescription().getDisplayName());
                String message = String.valueOf(f.getException()).split("\n")[0];
                System.out.println("FAIL " + f.getDescription().getDisplayName() + ": " + message);
            }
            @Override public void testFinished(Description d) {
                if (!failed.contains(d.getDisplayName())) System.out.println("PASS " + d.getDisplayName());
            }
        });
        Filter filter = new Filter() {
            @Override public boolean shouldRun(Description d) {
                return d.getMethodName() == null || !NEEDS_HOST_TOOLS.contains(d.getMethodName());
            }
            @Override public String describe() { return "tests that need the broker host's tools"; }
        };
        Set<String> retryOnce = new HashSet<>(Arrays.asList(
            System.getenv().getOrDefault("RETRY_ONCE", "").split(",")));
        int run = 0, failed = 0;
        for (String name : args) {
            Class<?> cls = Class.forName(name);
            Result result = core.run(Request.aClass(cls).filterWith(filter));
            run += result.getRunCount();
            failed += result.getFailureCount();
            for (Failure f : result.getFailures()) {
                String method = f.getDescription().getMethodName();
                if (method == null || !retryOnce.contains(method)) continue;
                System.out.println("RETRY " + f.getDescription().getDisplayName());
                if (core.run(Request.method(cls, method)).wasSuccessful()) failed--;
            }
        }
        System.out.println("SUMMARY " + run + " " + failed);
        System.exit(0);
    }
}
