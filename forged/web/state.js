// What every view of the page shares: its state, the device's role, the connection, and
// drawing again (at most once a frame) after a change.

import { Link } from "./link.js";

const ROLES = ["read", "approve", "control", "owner"];

export const S = {
  view: "connecting", // "connecting" | "unpaired" | "list" | "session"
  problem: "",
  banner: "",
  role: null,
  device: null,
  sessions: [],
  stored: [],
  cwd: "",
  s: null, // the open session: its state, transcript, dialogs, panels
  models: [],
  levels: [],
};

// Whether the device's role allows what `need` names (docs/remote.md, Roles).
export const may = (need) => ROLES.indexOf(S.role) >= ROLES.indexOf(need);

// The page's one connection; app.js gives it its event and status handlers.
export const link = new Link({ onEvent: () => {}, onStatus: () => {} });

let draw = () => {};
let drawn = false;

export function onDraw(drawing) {
  draw = drawing;
}

export function update() {
  if (drawn) return;
  drawn = true;
  requestAnimationFrame(() => {
    drawn = false;
    draw();
  });
}

// `work` done, its failure said where the user looks (`where`: the open session, or the
// list), and the page drawn again.
export async function act(work, where = S.s) {
  if (where) where.problem = "";
  else S.problem = "";
  try {
    await work();
  } catch (error) {
    if (where) where.problem = error.message;
    else S.problem = error.message;
  }
  update();
}
