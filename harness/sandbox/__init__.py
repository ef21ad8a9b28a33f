"""Running untrusted code (HumanEval completions): execute.py picks a containment backend (bwrap,
unshare, none) and runs a program under limits; child.py is the script that runs inside, with its
audit hook; cases.py holds the hostile completions of the self-test. May import: harness.core.
"""
