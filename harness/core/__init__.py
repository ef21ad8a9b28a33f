"""The infrastructure every room builds on, none of it about models or machines.

errors (the error kinds and their exit statuses), jsonio (strict JSON, schema checks, atomic
writes), locks, progress (bars on a terminal, log lines elsewhere), termination (SIGTERM as a clean
stop), timing (the device clock and timed medians) and descriptive (medians and spreads). May
import nothing else of harness.
"""
