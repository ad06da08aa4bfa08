"""The simulated host: a directory laid out like a real dual-5090 Ubuntu 24.04 host, with
stand-in commands that change it the way the real commands change a real host.

state.json under <root>/.p2pkit-sim/ is the truth; `render` lays out sysfs, /proc and /etc from
it. Stand-ins change the state (install a driver, a module, a GRUB drop-in) and re-render;
`p2pkit sim reboot` applies what only a reboot applies (the module that loads, the command line).
"""
