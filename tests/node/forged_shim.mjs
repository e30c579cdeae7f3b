// What RpcClient spawns with `node`: forged itself, with the arguments it was given.
// FORGED_COMMAND is forged's command line (JSON), e.g. ["/venv/bin/forged"] or [..., "connect"].
import { spawn } from "node:child_process";

const command = JSON.parse(process.env.FORGED_COMMAND);
const child = spawn(command[0], [...command.slice(1), ...process.argv.slice(2)],
                    { stdio: "inherit" });
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => child.kill(signal));
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
