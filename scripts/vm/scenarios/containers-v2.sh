# timeout: 300
# needs: container-rootfs
# Docker containers under memwatch on cgroup v2 with systemd (Debian 13's docker.io, the systemd
# cgroup driver: a container is system.slice/docker-ID.scope). The image is the test image's root
# (scripts/container-image.sh, on the input disk as rootfs.tar), imported: nothing pulled. A container
# attached by its host pid is named after it, its cgroup is its scope, a pause by hand freezes it and
# a resume lets it run, docker saying "running" after. On v2 docker's pause and memwatch's freeze
# write the same cgroup.freeze: memwatch first, `docker pause` and `docker unpause` must leave
# memwatch's hold (seen: runc refuses both, "container not running" and "is not paused"; a freeze
# undone all the same would be made again at memwatch's next sample, which the line reports); the
# user first, memwatch holds the job by signals and its resume leaves the user's pause. A container growing past 95 % of its
# --memory limit is paused by the policy, never OOM-killed, and resumed once `docker update` raises it.
. /mnt/in/lib.sh
S=containers-v2
api_job() { curl -sf 127.0.0.1:9300/api/v1/jobs | jq -c ".jobs[] | select(.name == \"$1\")"; }
job_field() { curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"$1\") | $2"; }

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
systemctl start docker >/tmp/docker-start.log 2>&1
wait_until 60 docker info || { result $S fail "setup: dockerd did not start: $(tail -n 3 /tmp/docker-start.log) $(journalctl -u docker -n 5 --no-pager | tr '\n' ' ')"; exit 1; }
t0=$(now_ms)
docker import "$IN/rootfs.tar" memwatch-test:vm >/dev/null || { result $S fail "setup: docker import of the test image failed"; exit 1; }
result $S ok "setup: dockerd $(docker version -f '{{.Server.Version}}'), cgroup driver $(docker info -f '{{.CgroupDriver}}'), image imported in $(($(now_ms) - t0)) ms"

TICK='import os, sys, time
grow = int(sys.argv[1]) if len(sys.argv) > 1 else 0
held, n = [], 0
while True:
    n += 1
    open("/tmp/tick", "w").write(str(n))
    if grow and len(held) < grow:
        held.append(bytearray(b"x" * (1 << 20)))
        open("/tmp/mib", "w").write(str(len(held)))
    time.sleep(0.05 if grow else 0.1)'
ticks() { docker exec "$1" cat /tmp/tick 2>/dev/null || echo 0; }
# still NAME: no tick over 1.5 s (the container is held). A frozen container's exec hangs: read the
# file through the host instead.
tick_file() { echo "/proc/$(docker inspect -f '{{.State.Pid}}' "$1")/root/tmp/tick"; }
still() { a=$(cat "$(tick_file "$1")"); sleep 1.5; [ "$a" = "$(cat "$(tick_file "$1")")" ]; }
moving() { a=$(cat "$(tick_file "$1")"); sleep 0.5; [ "$a" != "$(cat "$(tick_file "$1")")" ]; }
scope_frozen() { [ "$(cg_key "$scope/cgroup.events" frozen)" = 1 ]; }
freeze_asked() { [ "$(cat "$scope/cgroup.freeze")" = 1 ]; }
phase_is() { [ "$(job_field "$1" .pause.phase)" = "$2" ]; }
grown_to() { [ "$(cat "/proc/$1/root/tmp/mib" 2>/dev/null)" = "$2" ]; }

# By hand, and docker's pause beside memwatch's.
docker rm -f mwc >/dev/null 2>&1
docker run -d --name mwc --network none memwatch-test:vm python3 -c "$TICK" >/dev/null
wait_until 30 test -s "$(tick_file mwc)" || { result $S fail "hand: the container never ticked: $(docker logs mwc 2>&1 | tail -n 3)"; exit 1; }
pid=$(docker inspect -f '{{.State.Pid}}' mwc)
id=$(docker inspect -f '{{.Id}}' mwc)
said=$(memwatch attach "$pid" 2>&1)
name=$(echo "$said" | sed -n 's/^attached \(.*\) (pid .*/\1/p')
cg=$(job_field "$name" '.sample.cgroup.path')
if [ "$name" = mwc ] && [ "$cg" = "/system.slice/docker-$id.scope" ]; then
  result $S ok "name: attached by host pid $pid as $name, cgroup $cg"
else
  result $S fail "name: attach said '$said'; cgroup '$cg' (want /system.slice/docker-$id.scope)"
fi
scope=/sys/fs/cgroup/system.slice/docker-$id.scope
memwatch pause "$name" >/dev/null
if wait_until 10 scope_frozen && still mwc; then
  result $S ok "hand: paused by memwatch: $scope frozen, no tick for 1.5 s, docker says $(docker inspect -f '{{.State.Status}}' mwc)"
else
  result $S fail "hand: not held: $(api_job "$name" | jq -c .pause)"
fi
paused_said=$(docker pause mwc 2>&1)
paused_state=$(docker inspect -f '{{.State.Status}}' mwc)
unpaused_said=$(docker unpause mwc 2>&1)
after_unpause=$(cat "$scope/cgroup.freeze")
sleep 1.5 # a sample of memwatch's, to find its freeze undone
events=$(curl -sf '127.0.0.1:9300/api/v1/events?limit=50' | jq -r '[.events[] | select(.reason == "freeze" and .action == "pause")] | length')
if freeze_asked && still mwc && [ "$(job_field "$name" .state)" = paused ]; then
  result $S ok "unpause: held through docker pause ('$paused_said', docker said $paused_state) and docker unpause ('$unpaused_said'): cgroup.freeze $after_unpause right after the unpause, frozen, no tick for 1.5 s; freezes made again by memwatch: $events"
else
  result $S fail "unpause: after docker pause ('$paused_said') and unpause ('$unpaused_said') cgroup.freeze $after_unpause then $(cat "$scope/cgroup.freeze"), ticks moving: $(moving mwc && echo yes || echo no), memwatch says $(job_field "$name" .state), freezes made again: $events"
fi
memwatch resume "$name" >/dev/null
if wait_until 10 moving mwc && [ "$(docker inspect -f '{{.State.Status}}' mwc)" = running ]; then
  result $S ok "resume: ticking again, docker says running"
else
  result $S fail "resume: state $(job_field "$name" .state), docker $(docker inspect -f '{{.State.Status}}' mwc), cgroup.freeze $(cat $scope/cgroup.freeze)"
fi
# The user first: memwatch holds it by signals, and its resume leaves the user's pause.
docker pause mwc >/dev/null
memwatch pause "$name" >/dev/null
wait_until 10 phase_is "$name" held
how=$(job_field "$name" '.pause.mechanism.kind')
memwatch resume "$name" >/dev/null
sleep 1
if [ "$how" = signals ] && [ "$(docker inspect -f '{{.State.Status}}' mwc)" = paused ] && [ "$(cat $scope/cgroup.freeze)" = 1 ] && still mwc; then
  docker unpause mwc >/dev/null
  if wait_until 10 moving mwc; then
    result $S ok "user-first: memwatch held it by $how, its resume left docker's pause; docker unpause let it run"
  else
    result $S fail "user-first: after docker unpause it does not tick (states: $(cat /proc/$pid/status | grep State))"
  fi
else
  result $S fail "user-first: memwatch held it by '$how'; after its resume docker says $(docker inspect -f '{{.State.Status}}' mwc), cgroup.freeze $(cat $scope/cgroup.freeze)"
  docker unpause mwc >/dev/null 2>&1
fi
memwatch detach "$name" >/dev/null 2>&1
docker rm -f mwc >/dev/null 2>&1

# By the policy: a container growing toward 300 MiB under --memory 200m.
docker rm -f mwg >/dev/null 2>&1
docker run -d --name mwg --network none --memory 200m --memory-swap 200m memwatch-test:vm python3 -c "$TICK" 300 >/dev/null
pid=$(docker inspect -f '{{.State.Pid}}' mwg)
memwatch attach "$pid" >/dev/null
if wait_until 60 phase_is mwg held; then
  at=$(cat "/proc/$pid/root/tmp/mib" 2>/dev/null)
  docker update --memory 400m --memory-swap 400m mwg >/dev/null
  if wait_until 60 grown_to "$pid" 300; then
    oom=$(docker inspect -f '{{.State.OOMKilled}}' mwg)
    kills=$(awk '$1 == "oom_kill" { print $2 }' "/sys/fs/cgroup/system.slice/docker-$(docker inspect -f '{{.Id}}' mwg).scope/memory.events")
    if [ "$oom" = false ] && [ "${kills:-0}" = 0 ]; then
      result $S ok "policy: paused at $at MiB of 200, resumed once docker update raised it to 400, reached 300 MiB; OOMKilled $oom, oom_kill ${kills:-0}, docker says $(docker inspect -f '{{.State.Status}}' mwg)"
    else
      result $S fail "policy: OOMKilled $oom, oom_kill $kills"
    fi
  else
    result $S fail "policy: never reached 300 MiB after the raise (at $(cat /proc/$pid/root/tmp/mib 2>/dev/null); $(api_job mwg | jq -c '{state, pause}'))"
  fi
else
  result $S fail "policy: never held (at $(cat /proc/$pid/root/tmp/mib 2>/dev/null) MiB; OOMKilled $(docker inspect -f '{{.State.OOMKilled}}' mwg); $(api_job mwg | jq -c '{state, pause}'))"
fi
memwatch detach mwg >/dev/null 2>&1
docker rm -f mwg >/dev/null 2>&1
exit "${FAILED:-0}"
