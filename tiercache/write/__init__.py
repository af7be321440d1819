"""The write path: staged files, committers, the journal's states, uploads and repairs.

``staged`` → ``behind`` (or ``through``) → ``state`` → ``uploader``; ``reconcile`` repairs
what crashes leave, ``keys`` refuses keys no store accepts.
"""
