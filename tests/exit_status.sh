#!/usr/bin/env bash
# Runs a command and prints its exit status last ("exit status N"), so that a CTest regular
# expression can check the message and the status together.
"$@"
echo "exit status $?"
