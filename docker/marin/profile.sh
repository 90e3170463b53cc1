# Installed as /etc/profile.d/marin.sh in the cluster image (docker/marin/Dockerfile.cluster).
#
# Ray's launcher runs every command in the container through a login shell
# (`docker exec ... bash --login -c -i "source ~/.bashrc; ..."`). Debian's /etc/profile resets PATH
# for login shells, dropping the virtualenv that the image's ENV put first; /etc/profile then reads
# this file, which puts it back, so `ray`, `python` and `marin` are the image's own.
marin_venv_bin="${UV_PROJECT_ENVIRONMENT:-/opt/marin/venv}/bin"
case ":${PATH}:" in
    *":${marin_venv_bin}:"*) ;;
    *) PATH="${marin_venv_bin}:${PATH}"; export PATH ;;
esac
unset marin_venv_bin
