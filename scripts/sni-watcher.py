#!/usr/bin/env python3
"""A minimal StatusNotifierWatcher (what a desktop panel provides) for a
bare D-Bus session under Xvfb, so the app's tray icon registers as on a
desktop: `dbus-run-session -- sh -c 'scripts/sni-watcher.py & xvfb-run -a ...'`.
Needs `pip install dbus-next`. Prints each item that registers."""
import asyncio

from dbus_next.aio import MessageBus
from dbus_next.service import ServiceInterface, dbus_property, method, signal
from dbus_next.constants import PropertyAccess


class Watcher(ServiceInterface):
    def __init__(self):
        super().__init__("org.kde.StatusNotifierWatcher")
        self.items = []

    @method()
    def RegisterStatusNotifierItem(self, service: "s"):
        self.items.append(service)
        print(f"sni-watcher: registered {service}", flush=True)
        self.StatusNotifierItemRegistered(service)

    @method()
    def RegisterStatusNotifierHost(self, service: "s"):
        pass

    @signal()
    def StatusNotifierItemRegistered(self, service) -> "s":
        return service

    @dbus_property(access=PropertyAccess.READ)
    def RegisteredStatusNotifierItems(self) -> "as":
        return self.items

    @dbus_property(access=PropertyAccess.READ)
    def IsStatusNotifierHostRegistered(self) -> "b":
        return True

    @dbus_property(access=PropertyAccess.READ)
    def ProtocolVersion(self) -> "i":
        return 0


async def main():
    bus = await MessageBus().connect()
    bus.export("/StatusNotifierWatcher", Watcher())
    await bus.request_name("org.kde.StatusNotifierWatcher")
    print("sni-watcher: ready", flush=True)
    await asyncio.get_running_loop().create_future()


asyncio.run(main())
